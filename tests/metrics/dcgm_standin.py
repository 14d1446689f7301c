"""A stand-in for NVIDIA's dcgm-exporter: its Prometheus text, with its names, labels and quirks, rendered from
a GPU backend's samples on each scrape and served on 127.0.0.1. What the real exporter does that it copies:
``# HELP``/``# TYPE`` lines; per GPU the labels gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION and the empty container/namespace/pod of its pod mapping; per MIG device its parent's
labels plus GPU_I_PROFILE and GPU_I_ID; DCGM_FI_DEV_GPU_UTIL at 0 for MIG devices and MIG-mode GPUs (it cannot
measure them); utilisation of a MIG device only as the profiling ratio DCGM_FI_PROF_GR_ENGINE_ACTIVE; and
figures a device does not report left out (never a made-up value)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sessions.gpus.backends.base import GpuSample

FIELDS = [  # (name, type, help) in the exporter's default counter set
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
]


def _labels(pairs: dict[str, str]) -> str:
    return ",".join(f'{key}="{value}"' for key, value in pairs.items())


def render(samples: list[GpuSample], hostname: str) -> str:
    rows: dict[str, list[str]] = {name: [] for name, _, _ in FIELDS}
    for gpu in samples:
        if gpu.problem:
            continue  # the exporter lists no GPU it cannot read
        base = {
            "gpu": str(gpu.index),
            "UUID": gpu.uuid,
            "pci_bus_id": f"00000000:{0x3B + gpu.index:02X}:00.0",
            "device": f"nvidia{gpu.index}",
            "modelName": f"NVIDIA {gpu.model_name}",
            "Hostname": hostname,
            "DCGM_FI_DRIVER_VERSION": "570.133.20",
            "container": "",
            "namespace": "",
            "pod": "",
        }
        mig_mode = bool(gpu.devices) or gpu.utilization is None
        free = (
            None
            if gpu.memory_total_mib is None or gpu.memory_used_mib is None
            else gpu.memory_total_mib - gpu.memory_used_mib
        )
        figures = {
            "DCGM_FI_DEV_SM_CLOCK": gpu.sm_clock_mhz,
            "DCGM_FI_DEV_MEM_CLOCK": gpu.memory_clock_mhz,
            "DCGM_FI_DEV_GPU_TEMP": gpu.temperature_c,
            "DCGM_FI_DEV_POWER_USAGE": gpu.power_w,
            "DCGM_FI_DEV_GPU_UTIL": 0 if mig_mode else gpu.utilization,
            "DCGM_FI_DEV_FB_FREE": free,
            "DCGM_FI_DEV_FB_USED": gpu.memory_used_mib,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": gpu.ecc_errors,
        }
        for name, value in figures.items():
            if value is not None:
                rows[name].append(f"{name}{{{_labels(base)}}} {value:g}")
        for device in gpu.devices:
            mig = {**base, "GPU_I_PROFILE": device.profile, "GPU_I_ID": str(device.gi_id)}
            device_figures = {
                "DCGM_FI_DEV_GPU_UTIL": 0,  # what the exporter reports for a MIG device: not a measurement
                "DCGM_FI_DEV_FB_FREE": device.memory_total_mib - device.memory_used_mib,
                "DCGM_FI_DEV_FB_USED": device.memory_used_mib,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": None if device.utilization is None else device.utilization / 100,
            }
            for name, value in device_figures.items():
                if value is not None:
                    rows[name].append(f"{name}{{{_labels(mig)}}} {value:g}")
    lines = []
    for name, kind, text in FIELDS:
        if rows[name]:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *rows[name]]
    return "\n".join(lines) + "\n"


class Exporter:
    """Serves ``render(sample())`` at http://127.0.0.1:PORT/metrics; ``down`` makes it answer 503."""

    def __init__(self, sample: Callable[[], list[GpuSample]], hostname: str = "gpu-node-1") -> None:
        self.sample, self.hostname, self.down = sample, hostname, False
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                if exporter.down or self.path != "/metrics":
                    self.send_error(503 if exporter.down else 404)
                    return
                body = render(exporter.sample(), exporter.hostname).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def __enter__(self) -> Exporter:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
