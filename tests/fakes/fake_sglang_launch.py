"""A stand-in for `python -m sglang.launch_server`: accepts its flags, serves the fake over HTTP.

What it is: the process the launcher tests start, so that spawning, health waiting, process-group
signalling and supervision run against a real subprocess. Flags of launch_server it does not use
are accepted and ignored. `--fake-*` flags script misbehaviour:

  --fake-startup-delay-s S   listen only after S seconds (model loading)
  --fake-exit-after-s S      print a fatal line and exit with --fake-exit-code before listening
  --fake-crash-after-s S     exit with code 1 S seconds after becoming healthy
  --fake-crash-once-file F   crash as above only if F does not exist yet (then create it)
  --fake-spawn-child         start a grandchild in the same process group; print its pid
  --fake-ignore-sigterm      ignore SIGTERM (the grandchild too), so only SIGKILL stops it

    python -m tests.fakes.fake_sglang_launch --model-path m --port 30000 --tp-size 1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

import anyio

from tests.fakes.sglang_server import FakeSGLangServer

_CHILD = (
    "import signal, sys, time\n"
    "if sys.argv[1] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "time.sleep(600)\n"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fake_sglang_launch")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--mem-fraction-static", type=float, default=0.9)
    p.add_argument("--enable-memory-saver", action="store_true")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--fake-startup-delay-s", type=float, default=0.0)
    p.add_argument("--fake-exit-after-s", type=float, default=None)
    p.add_argument("--fake-exit-code", type=int, default=3)
    p.add_argument("--fake-crash-after-s", type=float, default=None)
    p.add_argument("--fake-crash-once-file", default=None)
    p.add_argument("--fake-spawn-child", action="store_true")
    p.add_argument("--fake-ignore-sigterm", action="store_true")
    return p


def _log(line: str) -> None:
    print(line, flush=True)


def _should_crash(args: argparse.Namespace) -> bool:
    if args.fake_crash_after_s is None:
        return False
    if args.fake_crash_once_file is None:
        return True
    if os.path.exists(args.fake_crash_once_file):
        return False
    open(args.fake_crash_once_file, "w").close()
    return True


async def _serve(args: argparse.Namespace) -> None:
    await anyio.sleep(args.fake_startup_delay_s)
    config = os.path.join(args.model_path, "config.json")  # a model directory bounds the tokens
    vocab = json.loads(open(config).read()).get("vocab_size") if os.path.isfile(config) else None
    async with FakeSGLangServer(
        host=args.host, port=args.port, model_path=args.model_path, tp_size=args.tp_size, vocab_size=vocab
    ):
        _log(f"The server is fired up and ready to roll! (port {args.port}, pid {os.getpid()})")
        if _should_crash(args):
            await anyio.sleep(args.fake_crash_after_s)
            _log("fatal: scheduler died (fake crash)")
            os._exit(1)
        await anyio.sleep_forever()


def main(argv: list[str] | None = None) -> None:
    args, unknown = _parser().parse_known_args(argv)
    _log(f"FAKE_PID={os.getpid()} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    _log(f"fake sglang.launch_server: {vars(args)} ignored={unknown}")
    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.fake_spawn_child:
        flag = "1" if args.fake_ignore_sigterm else "0"
        child = subprocess.Popen([sys.executable, "-c", _CHILD, flag])
        _log(f"FAKE_CHILD_PID={child.pid}")
    if args.fake_exit_after_s is not None:
        import time

        time.sleep(args.fake_exit_after_s)
        _log("fatal: CUDA out of memory while loading weights (fake)")
        sys.exit(args.fake_exit_code)
    anyio.run(_serve, args)


if __name__ == "__main__":
    main()
