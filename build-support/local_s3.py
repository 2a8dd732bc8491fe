"""An S3 API on this machine (127.0.0.1) for trying a deployment on object storage: moto's
server, which the tests use too (``tests/support/s3_server.py``).

``up`` starts it, makes the buckets asked for, prints the settings that point dcp-cdc at it
(``[spark.conf]`` lines for the configuration, the AWS environment for every process) and stays
in the foreground until Ctrl-C or SIGTERM. moto keeps every object in the server's memory: what
it holds is gone when it stops. It is a rehearsal's object store, not a production one; a
deployment points the same settings at its own S3 (AWS, MinIO, Ceph: any store that honours
conditional writes, ``If-None-Match: *``, which docs/object-storage.md explains).

    python build-support/local_s3.py up [--port 9000] [--bucket lake ...]
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading

ACCESS_KEY = "dcp-cdc-local-access"
SECRET_KEY = "dcp-cdc-local-secret"  # moto accepts any key: these only have to be the same
REGION = "us-east-1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_s3.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start the S3 server and stay in the foreground")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=9000)
    up.add_argument("--bucket", action="append", default=[], help="a bucket to make (repeat)")
    args = parser.parse_args(argv)

    import boto3
    from moto.server import ThreadedMotoServer

    # moto's server fails in its own thread on a taken port: try the port here first
    try:
        with socket.socket() as probe:
            probe.bind((args.host, args.port))
    except OSError as error:
        print(f"local_s3.py: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 2
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address=args.host, port=args.port, verbose=False)
    server.start()
    endpoint = f"http://{args.host}:{args.port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )
    for bucket in args.bucket:
        client.create_bucket(Bucket=bucket)
    print(f"S3 API on {endpoint}; buckets: {', '.join(args.bucket) or '(none)'}")
    print("\n# the configuration's [spark.conf]:")
    print(f'"spark.hadoop.fs.s3a.endpoint" = "{endpoint}"')
    print(f'"spark.hadoop.fs.s3a.endpoint.region" = "{REGION}"')
    print('"spark.hadoop.fs.s3a.path.style.access" = "true"')
    print('"spark.hadoop.fs.s3a.connection.ssl.enabled" = "false"')
    print("\n# the environment of every dcp-cdc process (and of make airflow-up):")
    print(f"export AWS_ACCESS_KEY_ID={ACCESS_KEY} AWS_SECRET_ACCESS_KEY={SECRET_KEY}")
    print(f"export AWS_DEFAULT_REGION={REGION}")
    print("\nCtrl-C stops it (and forgets every object).", flush=True)

    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
