#!/opt/fedsim/bin/python
"""Container health check: ask a Flower process's gRPC health service (``--health-server-address``,
plaintext, bound inside the container) whether it is serving. Exit 0 if so, 1 otherwise.

The address is the first argument, else ``$FEDSIM_HEALTH_ADDRESS`` (default ``127.0.0.1:9098``):
containers sharing the host's network need one each, given to the Flower process and here alike.
"""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

address = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FEDSIM_HEALTH_ADDRESS", "127.0.0.1:9098")
try:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    sys.exit(0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1)
except grpc.RpcError:
    sys.exit(1)
