"""The ``feedline`` command line (also ``python -m feedline.cli``).

    feedline demo [--epochs N] [--replicas R] [--workers W] [--data-dir D]
            [--checkpoint-dir C] [--resume] [--seed S]
        the custom training tutorial with MirroredStrategy (the main job); with --workers,
        under MultiWorkerMirroredStrategy on W processes of this machine (torchrun)
    feedline demo --parameter-server [--steps N] [--print-every N] [--batch-size B] ...
        a local cluster (this process the chief, 2 workers and 2 ps as `feedline server`
        processes) training a large sharded embedding through ClusterCoordinator.schedule;
        prints steps/s and the loss
    feedline pipeline-demo [--examples N] [--batch-size B]
        a tour of feedline.data: rates and a mid-epoch checkpoint
    feedline dispatcher [--port 5050] [--bind ADDR] [--work-dir DIR [--fault-tolerant]
            [--journal-sync full|normal]] [--worker-addresses A,B] [--status-port P]
        a data service dispatcher, until SIGTERM or SIGINT; --fault-tolerant keeps its state
        in an SQLite journal in --work-dir and a restart on the same directory and port
        resumes it (--journal-sync normal: no fsync per commit, durable against its own crash
        but not a power cut)
    feedline worker --dispatcher HOST:PORT [--port 0] [--bind ADDR] [--worker-address A]
            [--drain-seconds 10] [--dispatcher-timeout 60] [--wait-forever] [--status-port P]
        a data service worker, until SIGTERM or SIGINT (it drains first) or until its
        dispatcher stays unreachable past --dispatcher-timeout (exit code 2)
    feedline autoscale --dispatcher HOST:PORT --backend local|kubernetes --max-workers M
            [--min-workers 1] [--interval 1] [--scale-down 5] [--stabilization 300]
            [--drain-seconds 10] [--deployment feedline-worker] [--namespace NS]
        keeps as many workers as the dispatcher's jobs need, until SIGTERM or SIGINT:
        local `feedline worker` processes, or the replicas of a Kubernetes Deployment
    feedline diagnose --dispatcher HOST:PORT [--seconds 5]
        names what holds each running job's input back (the map function, a reader, too
        few workers, the network, the trainer) and the gain of one more worker
    feedline server [--cluster-spec JSON --job ps|worker --task I]
        a ps or worker task of a ParameterServerStrategy cluster (from TF_CONFIG unless
        --cluster-spec is given), until SIGTERM or SIGINT
    feedline membership-store [--host 127.0.0.1] [--port 29400]
        the store where the workers of elastic MultiWorkerMirroredStrategy jobs meet
        (ElasticClusterResolver), until SIGTERM or SIGINT
    feedline torchrun TORCHRUN-ARGS
        torchrun (python -m torch.distributed.run) with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
        unless set: its agents can join a running job's later rendezvous rounds
    feedline --version

``feedline COMMAND --help`` lists a command's options. Exit codes: 0 on success and after
SIGTERM or SIGINT; 2 for every failure, reported as one line ``feedline COMMAND: error: ...``:
a bad argument, a bad configuration, a file or folder it may not use, a server that stops on
its own (a worker whose dispatcher stayed unreachable, a dispatcher whose journal failed).
``feedline torchrun`` becomes torchrun: its help, output and exit codes are torchrun's.

Example:
  >>> from feedline.cli import main
  >>> main(["pipeline-demo", "--examples", "0"])
  Traceback (most recent call last):
  ...
  SystemExit: 2
"""

from feedline.cli._main import main

__all__ = ["main"]
