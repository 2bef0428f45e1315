"""Every option of the ``feedline`` command line, defined once.

``build_parser()`` is the ``feedline`` parser with one sub-command per thing it runs, each with
its own options and ``--help``; ``parameter_server_demo_parser()`` is the parser of
``feedline demo --parameter-server``, whose options differ from the tutorial's (its ``--workers``
are cluster tasks, not torchrun processes). Each sub-command names the function that runs it
(``RUN``, ``"module:function"``), called with the parsed options as keyword arguments.

A bad argument is one line on stderr, ``feedline CMD: error: ...``, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

#: The namespace key that holds the ``"module:function"`` that runs a sub-command.
RUN = "run"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``PROG: error: MESSAGE``, exit code 2
    (argparse's default prints the whole usage first), and that names the sub-command an
    unknown argument was given to (argparse's names the top-level program).

    Attributes:
      commands: the sub-commands' parsers by name.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, Parser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def parse_command(self, argv: Sequence[str]) -> argparse.Namespace:
        """``parse_args``, with an unknown argument reported by its sub-command's parser."""
        args, extras = self.parse_known_args(argv)
        if extras:
            owner = self.commands.get(getattr(args, "command", None) or "", self)
            owner.error(f"unrecognized arguments: {' '.join(extras)}")
        return args


class _Version(argparse.Action):
    """``--version``: prints ``feedline VERSION`` and exits (argparse's ``version`` action,
    with the version looked up only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show program's version number and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser._print_message(f"feedline {version()}\n", sys.stdout)
        parser.exit()


def version() -> str:
    """feedline's version: the installed distribution's, else ``feedline.__version__``."""
    from importlib import metadata  # ~0.1 s of a start-up: only for ``--version``

    try:
        return metadata.version("feedline")
    except metadata.PackageNotFoundError:
        import feedline

        return str(getattr(feedline, "__version__", "unknown"))


def positive_int(text: str) -> int:
    """An argparse ``type``: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def json_object(text: str) -> dict[str, Any]:
    """An argparse ``type``: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def build_parser() -> Parser:
    """The ``feedline`` parser: ``demo``, ``pipeline-demo``, ``dispatcher``, ``worker``,
    ``server``, ``autoscale``, ``diagnose``, ``membership-store``, ``torchrun``, each a
    sub-command with its own options (``torchrun``'s are torchrun's)."""
    parser = Parser(
        prog="feedline",
        description="feedline: TensorFlow's distributed input system for PyTorch.",
        epilog="`feedline COMMAND --help` lists a command's options.",
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    commands.required = True
    _add_demo(commands)
    _add_pipeline_demo(commands)
    _add_dispatcher(commands)
    _add_worker(commands)
    _add_server(commands)
    _add_autoscale(commands)
    _add_diagnose(commands)
    _add_membership_store(commands)
    _add_torchrun(commands)
    parser.commands.update(commands.choices)
    return parser


def parameter_server_demo_parser() -> Parser:
    """The parser of ``feedline demo --parameter-server``."""
    parser = Parser(
        prog="feedline demo --parameter-server",
        description="Trains a model with a large sharded embedding on a local cluster "
        "(1 chief, 2 workers, 2 ps) through ClusterCoordinator.schedule.",
    )
    parser.set_defaults(**{RUN: "feedline.cli._demos:parameter_server_demo"})
    parser.add_argument("--parameter-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--steps", default=1000, help="steps to train (%(default)s)", type=positive_int
    )
    parser.add_argument(
        "--print-every", default=100, help="print every N steps (%(default)s)", type=positive_int
    )
    parser.add_argument(
        "--batch-size", default=256, help="examples per step (%(default)s)", type=positive_int
    )
    parser.add_argument(
        "--rows", default=200_000, help="embedding rows (%(default)s)", type=positive_int
    )
    parser.add_argument(
        "--dim", default=32, help="embedding width (%(default)s)", type=positive_int
    )
    parser.add_argument(
        "--workers", default=2, help="worker tasks (%(default)s)", type=positive_int
    )
    parser.add_argument("--ps", default=2, help="ps tasks (%(default)s)", type=positive_int)
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds the training may take in all (%(default)s)",
    )
    return parser


Commands = Any  # argparse's _SubParsersAction, private in typeshed


def _command(commands: Commands, name: str, run: str, summary: str, description: str) -> Parser:
    parser: Parser = commands.add_parser(
        name,
        help=summary,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(**{RUN: run})
    return parser


def _add_membership_store(commands: Commands) -> None:
    parser = _command(
        commands,
        "membership-store",
        "feedline.cli._cluster:membership_store",
        "the store where the workers of elastic training jobs meet",
        "A torch.distributed TCPStore that outlives the workers of elastic\n"
        "MultiWorkerMirroredStrategy jobs: give its address to every worker\n"
        "(FEEDLINE_ELASTIC_STORE=HOST:PORT or ElasticClusterResolver(store_address)). It must\n"
        "live as long as the jobs; it keeps no files.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (%(default)s)")
    parser.add_argument("--port", type=int, default=29400, help="port, 0: any (%(default)s)")


def _add_torchrun(commands: Commands) -> None:
    # Listed here for `feedline --help`; `main` hands every argument after it to torchrun.
    _command(
        commands,
        "torchrun",
        "feedline.cli._torchrun:torchrun",
        "torchrun, with agents that can join a running job's later rendezvous rounds",
        "torchrun's elastic launcher (python -m torch.distributed.run) given the same\n"
        "arguments, with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 unless the environment sets it:\n"
        "with torch's default, an agent that joins a later round of the c10d rendezvous (a\n"
        "node added under --nnodes MIN:MAX, or one replacing a lost node) waits for ever\n"
        "(pytorch#135712). `feedline torchrun --help` is torchrun's.",
    )


def _add_demo(commands: Commands) -> None:
    parser = _command(
        commands,
        "demo",
        "feedline.cli._demos:demo",
        "the custom training tutorial with MirroredStrategy (the main job)",
        "TensorFlow's custom training tutorial on Fashion-MNIST (or scikit-learn's bundled\n"
        "digits offline) under MirroredStrategy: distributed datasets, checkpoints every 2\n"
        "epochs, the last one restored without a strategy. With --workers N, or started by\n"
        "torchrun or with TF_CONFIG, it trains under MultiWorkerMirroredStrategy.\n\n"
        "A progress bar shows on a terminal; in a log, one line per epoch.",
    )
    parser.add_argument(
        "--epochs",
        type=positive_int,
        default=None,
        help="default: 10 on Fashion-MNIST, 40 on digits",
    )
    parser.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="logical CPU replicas where there is no GPU: default 2, or 1 per worker",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="worker processes on this machine, through torchrun's launcher (%(default)s)",
    )
    parser.add_argument("--data-dir", default=None, help="folder with Fashion-MNIST's .gz files")
    parser.add_argument("--checkpoint-dir", default=None, help="default: a new temporary folder")
    parser.add_argument("--resume", action="store_true", help="go on from the latest checkpoint")
    parser.add_argument("--seed", type=int, default=0, help="shuffle and model seed (%(default)s)")
    parser.add_argument(
        "--parameter-server",
        action="store_true",
        help="instead: parameter-server training on a local cluster, with options of its own "
        "(`feedline demo --parameter-server --help`)",
    )


def _add_pipeline_demo(commands: Commands) -> None:
    parser = _command(
        commands,
        "pipeline-demo",
        "feedline.examples.pipeline_demo:run",
        "a tour of feedline.data: rates and a mid-epoch checkpoint",
        "A Fashion-MNIST-shaped input pipeline: its rate, a mid-epoch checkpoint restored to\n"
        "the same batches, and the seeds' batching table.",
    )
    parser.add_argument(
        "--examples", type=positive_int, default=60_000, help="images (%(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=64, help="images per batch (%(default)s)"
    )


_SERVICE_NOTES = (
    "It prints `feedline {role} serving at ADDRESS` once it serves (so that a script that\n"
    "passes --port 0 learns the port) and runs until SIGTERM or SIGINT (exit code 0). The\n"
    "shared secret, if any, is read from $FEEDLINE_SERVICE_TOKEN (one trailing newline is\n"
    "stripped). Off loopback it needs a token or mutual TLS, or --insecure. A configuration\n"
    "error is `feedline {role}: error: ...` and exit code 2, and so is a failure while it\n"
    "serves. docs/security.md describes the threat model."
)


def _add_dispatcher(commands: Commands) -> None:
    parser = _command(
        commands,
        "dispatcher",
        "feedline.cli._service:dispatcher",
        "a data service dispatcher",
        "A data service dispatcher (tf.data service's).\n\n"
        + _SERVICE_NOTES.format(role="dispatcher"),
    )
    _add_address(parser, default_port=5050)
    parser.add_argument("--work-dir", default=None, help="folder for the dispatcher's files")
    parser.add_argument(
        "--fault-tolerant",
        action="store_true",
        help="journal the dispatcher's state in --work-dir; restarted on the same --work-dir and "
        "port, it resumes its jobs",
    )
    parser.add_argument(
        "--journal-sync",
        choices=("full", "normal"),
        default="full",
        help="full: each journal commit is fsynced and survives a machine crash (default); "
        "normal: it survives the dispatcher's own crash, kill -9 included, but a power cut may "
        "lose the last commits, and it costs no fsync",
    )
    parser.add_argument(
        "--worker-addresses",
        default=None,
        help="comma-separated fixed worker list, for static sharding (FILE, DATA, HINT)",
    )
    parser.add_argument(
        "--worker-timeout-ms",
        type=positive_int,
        default=None,
        help="drop a worker without a heartbeat for this long: its tasks are lost and its "
        "distributed_save streams go to other workers (default 10000)",
    )
    parser.add_argument(
        "--client-timeout-ms",
        type=positive_int,
        default=None,
        help="release a consumer without a heartbeat for this long: under exactly-once "
        "epochs what it held and had not acknowledged goes back to its job (default 10000)",
    )
    _add_status_port(parser)
    add_security(parser)


def _add_worker(commands: Commands) -> None:
    parser = _command(
        commands,
        "worker",
        "feedline.cli._service:worker",
        "a data service worker",
        "A data service worker (tf.data service's).\n\n"
        + _SERVICE_NOTES.format(role="worker")
        + "\n\nOn SIGTERM it first drains for up to --drain-seconds: it takes no new work,\n"
        "finishes the DYNAMIC splits it began, hands out what it holds and tells the\n"
        "dispatcher it leaves; a second signal ends the drain at once. A dispatcher that stays\n"
        "unreachable past --dispatcher-timeout is `feedline worker: error: ...` and exit code 2.",
    )
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    _add_address(parser, default_port=0)
    parser.add_argument(
        "--worker-address", default=None, help="address consumers reach this worker at"
    )
    parser.add_argument(
        "--heartbeat-interval-ms",
        type=positive_int,
        default=None,
        help="the longest time between this worker's heartbeats (default 1000); the dispatcher's "
        "--worker-timeout-ms must be several of them",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="on SIGTERM, hand out what this worker holds for at most this long (%(default)s)",
    )
    parser.add_argument(
        "--dispatcher-timeout",
        type=float,
        default=60.0,
        help="seconds to keep trying an unreachable dispatcher before exiting (%(default)s)",
    )
    parser.add_argument(
        "--wait-forever",
        action="store_true",
        help="keep trying an unreachable dispatcher for as long as it takes",
    )
    parser.add_argument(
        "--buffer-memory-mib",
        type=int,
        default=256,
        help="MiB that the buffers of all of this worker's tasks hold together (%(default)s)",
    )
    parser.add_argument(
        "--cross-trainer-cache-mib",
        type=int,
        default=64,
        help="MiB each task of a cross-trainer job keeps in memory for its trainers "
        "(%(default)s); past it a finite epoch spills to local disk",
    )
    _add_status_port(parser)
    add_security(parser)


def _add_server(commands: Commands) -> None:
    parser = _command(
        commands,
        "server",
        "feedline.cli._cluster:server",
        "a ps or worker task of a ParameterServerStrategy cluster",
        "One ps or worker task of a ParameterServerStrategy cluster (tf.distribute.Server),\n"
        "from TF_CONFIG unless --cluster-spec is given. It prints\n"
        "`feedline server /job:JOB/task:I serving at HOST:PORT` once it serves and runs until\n"
        "SIGTERM or SIGINT (exit code 0); a configuration error is one line on stderr,\n"
        "`feedline server: error: ...`, and exit code 2. Calls are checked for\n"
        "$FEEDLINE_SERVICE_TOKEN when it is set; off loopback it needs a token or mutual TLS,\n"
        "or --insecure (docs/security.md).",
    )
    parser.add_argument(
        "--cluster-spec",
        type=json_object,
        default=None,
        help='the cluster, JSON: {"ps": [...], "worker": [...]}',
    )
    parser.add_argument("--job", default=None, help="this task's job: ps or worker")
    parser.add_argument("--task", type=int, default=None, help="this task's index in its job")
    add_security(parser)


def non_negative_float(text: str) -> float:
    """An argparse ``type``: a float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _add_autoscale(commands: Commands) -> None:
    parser = _command(
        commands,
        "autoscale",
        "feedline.cli._autoscale:autoscale",
        "keeps as many data service workers as the dispatcher's jobs need",
        "Asks the dispatcher every --interval seconds how many workers its running jobs need\n"
        "(the metric feedline_dispatcher_desired_workers: what the consumers would take were\n"
        "their input never late, over what a worker makes per busy second) and starts or\n"
        "drains workers to match, between\n"
        "--min-workers and --max-workers. More workers start at once; fewer once fewer were\n"
        "asked for during --scale-down seconds, a scale-down right after a scale-up at most\n"
        "once per --stabilization seconds, and never the last worker of a running job. A\n"
        "drained worker hands out what it holds and leaves; its remaining splits go to the\n"
        "others.\n\n"
        "Back-ends: local starts `feedline worker` processes on this machine (drained with\n"
        "SIGTERM, all of them when the autoscaler stops); kubernetes sets the replicas of the\n"
        "workers' Deployment (in a pod with its service account, else with the kubeconfig\n"
        "through the kubernetes package). It runs until SIGTERM or SIGINT (exit code 0); a\n"
        "bad option is `feedline autoscale: error: ...` and exit code 2.",
    )
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    parser.add_argument(
        "--backend", required=True, choices=("local", "kubernetes"), help="what runs the workers"
    )
    parser.add_argument(
        "--min-workers", type=int, default=1, help="never fewer workers (%(default)s)"
    )
    parser.add_argument(
        "--max-workers", type=positive_int, required=True, help="never more workers"
    )
    parser.add_argument(
        "--interval",
        type=non_negative_float,
        default=1.0,
        help="seconds between two looks at the dispatcher (%(default)s)",
    )
    parser.add_argument(
        "--stabilization",
        type=non_negative_float,
        default=300.0,
        help="at most one scale-down right after a scale-up this long; within it such a "
        "scale-down waits this long after the scale-up (%(default)s)",
    )
    parser.add_argument(
        "--scale-down",
        type=non_negative_float,
        default=5.0,
        help="seconds of fewer workers asked for before a scale-down, which goes to the most "
        "asked for over them (%(default)s)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=non_negative_float,
        default=10.0,
        help="local: how long a drained worker may hand out what it holds (%(default)s)",
    )
    parser.add_argument(
        "--deployment",
        default="feedline-worker",
        help="kubernetes: the workers' Deployment (%(default)s)",
    )
    parser.add_argument(
        "--namespace",
        default=None,
        help="kubernetes: its namespace (default: the pod's, else default)",
    )
    add_security(parser)


def _add_diagnose(commands: Commands) -> None:
    parser = _command(
        commands,
        "diagnose",
        "feedline.cli._autoscale:diagnose",
        "names the bottleneck of a data service's input",
        "Watches the dispatcher's jobs for --seconds and names, for each running job, what\n"
        "holds its input back: the map function, a reader, too few workers, the network, or\n"
        "the trainer itself; what to change; and the predicted gain of one more worker. An\n"
        "idle service says so. A dispatcher it cannot reach is `feedline diagnose: error:\n"
        "...` and exit code 2.",
    )
    parser.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    parser.add_argument(
        "--seconds",
        type=non_negative_float,
        default=5.0,
        help="how long to watch (%(default)s)",
    )
    add_security(parser)


def _add_address(parser: Parser, default_port: int) -> None:
    parser.add_argument(
        "--port",
        type=int,
        default=default_port,
        help="port to listen on, 0: any free (%(default)s)",
    )
    parser.add_argument("--bind", default="127.0.0.1", help="interface to listen on (%(default)s)")


def add_security(parser: Parser) -> None:
    """``--tls-cert``, ``--tls-key``, ``--tls-ca`` and ``--insecure``."""
    group = parser.add_argument_group("security (docs/security.md)")
    group.add_argument(
        "--tls-cert",
        default=None,
        help="PEM certificate to serve TLS with (also presented to peers for mutual TLS); "
        "default $FEEDLINE_TLS_CERT",
    )
    group.add_argument(
        "--tls-key", default=None, help="PEM key of --tls-cert; default $FEEDLINE_TLS_KEY"
    )
    group.add_argument(
        "--tls-ca",
        default=None,
        help="PEM CA certificates: peers are verified with them, and clients must present a "
        "certificate they sign (mutual TLS); default $FEEDLINE_TLS_CA",
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        help="serve off loopback without a token or mutual TLS (anyone who reaches the port can "
        "run code), and on loopback without this user's local secret",
    )


def _add_status_port(parser: Parser) -> None:
    parser.add_argument(
        "--status-port",
        type=int,
        default=None,
        help="serve a status page at http://BIND:PORT/ and Prometheus metrics at /metrics "
        "(0: any free port; default: none)",
    )
