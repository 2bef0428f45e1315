"""The ``feedline`` command line.

feedline demo [--epochs N] [--replicas R] [--data-dir D] [--checkpoint-dir C] [--resume]
    the custom training tutorial with MirroredStrategy (the main job)
feedline demo --parameter-server [--steps N] [--print-every N] [--batch-size B]
    a local cluster (this process the chief, 2 workers and 2 ps as `feedline server`
    processes) training a large sharded embedding through ClusterCoordinator.schedule;
    prints steps/s and the loss
feedline pipeline-demo [--examples N] [--batch-size B]
    a tour of feedline.data: rates and a mid-epoch checkpoint
feedline dispatcher [--port 5050] [--bind ADDR] [--work-dir DIR [--fault-tolerant]]
        [--worker-addresses A,B] [--status-port P]
    a data service dispatcher, until SIGTERM or SIGINT; --fault-tolerant keeps its state in an
    SQLite journal in --work-dir and a restart on the same directory and port resumes it
feedline worker --dispatcher HOST:PORT [--port 0] [--bind ADDR] [--worker-address A]
        [--drain-seconds 10] [--dispatcher-timeout 60] [--wait-forever] [--status-port P]
    a data service worker, until SIGTERM or SIGINT (it drains first) or until its dispatcher
    stays unreachable past --dispatcher-timeout (exit code 1)
feedline server [--cluster-spec JSON --job ps|worker --task I]
    a ps or worker task of a ParameterServerStrategy cluster (from TF_CONFIG unless
    --cluster-spec is given), until SIGTERM or SIGINT
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"] and "--parameter-server" in argv[1:]:  # its own --help, too
        from feedline.examples import parameter_server_demo

        return parameter_server_demo.main(argv[1:])
    parser = argparse.ArgumentParser(prog="feedline", description="feedline command line")
    parser.add_argument(
        "command",
        choices=["demo", "pipeline-demo", "dispatcher", "worker", "server"],
        help="what to run",
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "server":
        from feedline.distribute.parameter_server import server

        return server.main(rest)
    if args.command in ("dispatcher", "worker"):
        from feedline.service import _cli

        main = _cli.dispatcher_main if args.command == "dispatcher" else _cli.worker_main
        return main(rest)
    if args.command == "demo":
        from feedline.examples import custom_training

        return custom_training.main(rest)
    from feedline.examples import pipeline_demo

    return pipeline_demo.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
