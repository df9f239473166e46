"""``python -m soak``: run the chaos soak on PostgreSQL, MariaDB or both, judge each run, exit 1
on any violation."""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from soak.maria import DEFAULT_MARIADB, MariaSoak
from soak.run import DEFAULT_PG, KINDS, Options, Soak


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__)
    parser.add_argument("--seconds", type=float, default=90, help="how long writers write")
    parser.add_argument(
        "--seed", default="random", help="replays the fault schedule (default: a random one)"
    )
    parser.add_argument("--out", type=Path, help="evidence folder (default .afdb/soak/...)")
    parser.add_argument(
        "--control",
        action="store_true",
        help="turn the late-commit horizon off: the checker must then report lost rows",
    )
    parser.add_argument(
        "--calm",
        action="store_true",
        help="no faults and a handler that never fails or freezes (with --control: the loss "
        "comes from the missing horizon alone)",
    )
    parser.add_argument(
        "--pollers", type=int, default=2, help="processes per poller, competing for its lease"
    )
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument(
        "--fault-every", type=float, default=4.0, help="mean seconds between faults"
    )
    parser.add_argument(
        "--no-sink",
        action="store_true",
        help="the poller without its SqlSink: the next batch's handler then runs while the "
        "previous batch's commit is in flight (the pipelined engine), and (f) is not judged",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        help="with --no-sink: one checkpoint commit per this many rows (coalesced commits)",
    )
    parser.add_argument(
        "--low-latency",
        action="store_true",
        help="the PostgreSQL pollers in the low-latency mode (poll_interval=0.2, each run polls "
        "until its time budget ends) instead of a run a second",
    )
    parser.add_argument(
        "--no-delta", action="store_true", help="leave out the DeltaSink poller (PostgreSQL)"
    )
    parser.add_argument(
        "--no-queue", action="store_true", help="leave out the QueueSink poller (PostgreSQL)"
    )
    parser.add_argument(
        "--queue-every",
        type=int,
        default=4,
        metavar="N",
        help="the QueueSink poller forwards the rows whose id is a multiple of N (default 4: a "
        "queue on Azurite carries one message a request, 1 in 4 keeps a 2-hour run's queue "
        "within what one Azurite serves under faults; 1: every row)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        metavar="N",
        help="split the first poller (PostgreSQL's `soak`; MariaDB's `orders_timer`) over N shards "
        "(shards=N: N pollers, each with --pollers processes; default 1: not sharded)",
    )
    parser.add_argument(
        "--burst",
        type=int,
        help="rows of the burst written from 40%% of the run on (default: 100 a second of "
        "soak, at most 200,000)",
    )
    parser.add_argument("--no-burst", action="store_true", help="no burst")
    parser.add_argument(
        "--no-fault",
        action="append",
        default=[],
        choices=sorted(KINDS),
        metavar="KIND",
        help=f"leave this fault kind out (repeatable): {', '.join(KINDS)}",
    )
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL URI (default %(default)s)")
    parser.add_argument(
        "--db",
        choices=("pg", "mariadb", "both"),
        default="both",
        help="which database (default both, one after the other, each for --seconds)",
    )
    parser.add_argument(
        "--mariadb", default=DEFAULT_MARIADB, help="MariaDB URL (default %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.db != "pg" and (args.no_sink or args.checkpoint_every is not None):
        parser.error("--no-sink and --checkpoint-every are for the PostgreSQL soak (--db pg)")
    if args.checkpoint_every is not None and not args.no_sink:
        parser.error("--checkpoint-every needs --no-sink (a sink commits every batch)")
    if args.queue_every < 1:
        parser.error(f"--queue-every {args.queue_every}: N must be 1 (every row) or more")
    if args.shards != 1 and not 2 <= args.shards <= 64:
        parser.error(f"--shards {args.shards}: N must be 1 (not sharded) or 2 to 64")
    seed = random.SystemRandom().randrange(1, 10**6) if args.seed == "random" else int(args.seed)
    options = Options(
        seconds=args.seconds,
        seed=seed,
        out=args.out,
        control=args.control,
        calm=args.calm,
        pollers=args.pollers,
        writers=args.writers,
        fault_every=args.fault_every,
        pg=args.pg,
        sink=not args.no_sink,
        checkpoint_every=args.checkpoint_every,
        poll_interval=0.2 if args.low_latency else None,
        delta=not args.no_delta,
        queue=not args.no_queue,
        queue_every=args.queue_every,
        shards=args.shards,
        burst=0 if args.no_burst else args.burst,
        without=frozenset(args.no_fault),
    )
    failed = False
    for db in ("pg", "mariadb") if args.db == "both" else (args.db,):
        out = options.out / db if options.out is not None and args.db == "both" else options.out
        run = dataclasses.replace(options, out=out)
        soak = Soak(run) if db == "pg" else MariaSoak(run, args.mariadb)
        print(f"soak: {'PostgreSQL' if db == 'pg' else 'MariaDB'}", flush=True)
        report = soak.run()
        print(report.summary())
        if report.violations:
            failed = True
            print(
                f"soak FAILED on {db} (seed {seed}; evidence kept in {soak.out}):", file=sys.stderr
            )
            for violation in report.violations:
                print(f"  {violation}", file=sys.stderr)
        else:
            print(f"soak OK on {db} (seed {seed}; evidence in {soak.out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
