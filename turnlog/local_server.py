"""Child process: serve one GGUF model with llama.cpp's OpenAI-compatible server on loopback.

Started by ``turnlog.local_model.LocalModelServer``; runs until it is terminated.
"""

from __future__ import annotations

import argparse
import signal
import threading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2, help="threads that generate tokens")
    parser.add_argument(
        "--batch-threads", type=int, default=0, help="threads that read the prompt (0: --threads)"
    )
    parser.add_argument("--poll", type=int, default=50, help="how long idle threads spin (0-100; 0 sleeps)")
    parser.add_argument("--alias", default="", help="the model name the server reports")
    args = parser.parse_args()

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.context
    params.n_parallel = 1
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.batch_threads or args.threads
    params.cpuparams.poll = params.cpuparams_batch.poll = args.poll
    if args.alias:
        params.model_alias = {args.alias}
    params.use_jinja = True
    server = xllamacpp.Server(params)  # listens until the process ends
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"serving {args.model} at {server.listening_address}", flush=True)
    stop.wait()


if __name__ == "__main__":
    main()
