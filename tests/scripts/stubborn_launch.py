"""Run ``hf_grpo.launch.launcher.run_launcher`` over a stand-in training launch whose worker ignores SIGINT and SIGTERM (as a
worker stuck in a collective or a long generation does), with 2 s stop grace periods. The test signals this process
and then looks for the worker.

    python -m tests.scripts.stubborn_launch [--server OUTPUT_DIR] [--finish]

``--server``: a stand-in vLLM server first (answers ``/health``; its engine worker ignores SIGTERM), logging to
OUTPUT_DIR. ``--finish``: the training launch exits 0 at once instead.
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

from hf_grpo.launch import launcher as launch


# "accelerate": starts a worker, then waits for it; the worker ignores the polite signals and sleeps
WORKER = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
LAUNCH = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {WORKER!r}]).wait()"
# "vllm serve": starts an engine worker, then answers GET /health on the port it is given
SERVER = f"""
import http.server, subprocess, sys
subprocess.Popen([sys.executable, '-c', {WORKER!r}])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), Health).serve_forever()
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", metavar="OUTPUT_DIR")
    parser.add_argument("--finish", action="store_true")
    args = parser.parse_args()
    launch.STOP_GRACE_S = launch.WATCHDOG_GRACE_S = 2.0
    commands = [launch.Command("train", {}, [sys.executable, "-c", "pass" if args.finish else LAUNCH])]
    recipe = SimpleNamespace(training=SimpleNamespace(output_dir=None), layout=SimpleNamespace(num_processes=1))
    if args.server:
        port = launch.free_port()
        server = [sys.executable, "-c", SERVER, str(port)]
        commands.insert(0, launch.Command("server", {}, server, url=f"http://127.0.0.1:{port}"))
        recipe = SimpleNamespace(
            training=SimpleNamespace(output_dir=args.server),
            generation=SimpleNamespace(server_timeout=30),
            layout=recipe.layout,
        )
    launch.plan_commands = lambda recipe, argv: commands
    print("launched", flush=True)
    return launch.run_launcher(recipe, [])


if __name__ == "__main__":
    sys.exit(main())
