# The README names two targets: `make run` and `make test`.
.PHONY: run test lint format bench lock lab-up lab-down

run:
	compose/bin/run

test:
	compose/bin/test

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy && .venv/bin/lint-imports

format:
	.venv/bin/ruff check --fix . && .venv/bin/ruff format .

bench:
	.venv/bin/python -m bench $(or $(NAME),all)

# The multi-host lab (tests/lab): three GPU hosts, each a network namespace with its own Docker engine, one Swarm.
lab-up:
	compose/bin/ensure-docker && compose/bin/build-busybox-image && .venv/bin/python -m tests.lab up

lab-down:
	.venv/bin/python -m tests.lab down

# Re-pin every transitive package after changing requirements.in.
lock:
	rm -rf .venv-lock && python3.11 -m venv .venv-lock
	.venv-lock/bin/pip install --quiet -r requirements.in
	.venv-lock/bin/pip freeze --exclude-editable > requirements.lock
	rm -rf .venv-lock
