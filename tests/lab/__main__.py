"""By hand: ``python -m tests.lab up|down|check [--name NAME]`` (``make lab-up``, ``make lab-down``).

``up`` builds the lab (tests/lab/lab.py) with the busybox test image in every engine and prints how to reach
it; ``down`` removes it; ``check`` lists whatever of it is left on this machine (exit 1 if anything is)."""

from __future__ import annotations

import argparse
import sys

from tests.lab.fleet import devices, fleet_spec
from tests.lab.lab import BUSYBOX, Lab, LabError


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    parser.add_argument("action", choices=("up", "down", "check"))
    parser.add_argument("--name", default="gpl", help="the lab's name, which prefixes its namespaces (default gpl)")
    args = parser.parse_args()
    lab = Lab(args.name, devices=devices(fleet_spec(args.name)))
    try:
        if args.action == "up":
            lab.up(images=[BUSYBOX])
            print(f"lab {lab.name} up: {lab.swarm_nodes()}")
            for node in lab.nodes:
                print(f"  {node.name}  {node.address}  DOCKER_HOST={node.endpoint}")
            print(f"  fleet: PORTAL_SIMULATED_FLEET='{fleet_spec(lab.name)}'")
        elif args.action == "down":
            lab.down()
        left = lab.leftovers()
        if args.action != "up" and left:
            print("\n".join(left))
            return 1
    except LabError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 1
    return 0


sys.exit(main())
