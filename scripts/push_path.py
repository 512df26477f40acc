"""The code one push runs through, client to server and back, as a real 2-rank job runs it.

    .venv/bin/mpiexec -n 2 .venv/bin/python scripts/push_path.py [asgd train flags]

Trains one client against one server for 40 minibatches (`asgd train`, the defaults
unless flags say otherwise; `--eval-every 80` keeps the curve's snapshots and
checkpoints, which would fall on every other push of so short a run, to its start and
end) into runs/push_path-PID (the launcher's), and for the push it traces (PUSH, after the first few)
lists each function of ours called, in the order first called, on each side: the client
from building the push to taking the weights back, the server from waiting for the push
to recording it; then the modules that makes. For a newcomer reading one push
(docs/architecture.md) and for the house's one-push measure; a measurement, not a test.
"""
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
PUSH = 20  # the push traced, after the first ones' set-up (kernels compiled, files opened)
sys.path.insert(0, ROOT)

from clients.loop import ClientLoop  # noqa: E402 - the checkout's modules, after the path
from experiments.cli import main  # noqa: E402
from paramserver.drivers.server import ServerLoop  # noqa: E402
from paramserver.wire.protocol import Tag  # noqa: E402


class Trace:
    """Project functions called while `on`, in the order first called (callers too: a
    function already running when tracing starts shows as it calls on)."""

    def __init__(self):
        self.on, self.calls = False, {}

    def __call__(self, frame, event, arg):
        if self.on and event == "call":
            for f in (frame.f_back, frame):
                name = f and f.f_code.co_filename
                if name and name.startswith(ROOT) and "/.venv" not in name and not name.endswith(__file__):
                    self.calls.setdefault(f"{name[len(ROOT):]}:{f.f_code.co_qualname}", None)

    def report(self, side: str) -> None:
        modules = dict.fromkeys(call.split(":")[0] for call in self.calls)
        lines = [f"{side}: {len(self.calls)} functions in {len(modules)} modules",
                 *(f"  {call}" for call in self.calls), f"{side} modules: {' '.join(modules)}", ""]
        sys.stdout.write("\n".join(lines) + "\n")  # one write: the two ranks' lines do not interleave
        sys.stdout.flush()


trace = Trace()
build_push, take_weights, serve_one = ClientLoop._push, ClientLoop.take_weights, ServerLoop._serve_one


def traced_push(self, fetch):
    trace.on = trace.on or self.pushes == PUSH
    return build_push(self, fetch)


def traced_take_weights(self, data, reply=None):
    taken = take_weights(self, data, reply)
    if trace.on:
        trace.on = False
        trace.report("client")
    return taken


def traced_serve_one(self):
    """Each message traced afresh; kept where it is the push traced."""
    trace.calls, trace.on = {}, True
    answer, tags = self.answer, []
    self.answer = lambda msg: (tags.append(msg.tag), answer(msg))[1]
    try:
        return serve_one(self)
    finally:
        trace.on = False
        del self.answer
        if tags == [Tag.PUSH] and self.state.tally.client_pushes.sum() == PUSH + 1:
            trace.report("server")


ClientLoop._push, ClientLoop.take_weights, ServerLoop._serve_one = traced_push, traced_take_weights, traced_serve_one
sys.setprofile(trace)
threading.setprofile(trace)
sys.exit(main(["train", "--clients", "1", "--steps", str(2 * PUSH), "--eval-every", str(4 * PUSH), "--quiet", "--out",
               # a folder of this job's: both ranks' parent is the launcher's process on this host
               os.path.join(ROOT, "runs", f"push_path-{os.getppid()}"), *sys.argv[1:]]))
