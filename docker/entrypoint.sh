#!/bin/sh
# fedsim's container entrypoint: run the role's Flower command ($FEDSIM_ROLE) as uid 10001.
#
# Started as root (the default), it first copies the secrets mounted read-only at /secrets (a
# folder from `fedsim deploy certs`, or single files) into /certs, owned by 10001 with mode 0600,
# and makes /state and /runs (the SuperLink database and run folders, often fresh named volumes
# owned by root) writable by 10001; then it drops to 10001 for good. Keys stay 0600 and owned by
# whoever made them on the host. Started with --user 10001, it runs the command directly (the
# mounted files must then be readable by 10001).
set -eu
role="${FEDSIM_ROLE:?FEDSIM_ROLE names the Flower command of this image}"
if [ "$(id -u)" = "0" ]; then
    if [ -d /secrets ]; then
        cp -rL /secrets/. /certs/
    fi
    chown -R 10001:10001 /certs /state /runs
    chmod 700 /certs
    find /certs -type f -exec chmod 600 {} +
    exec setpriv --reuid=10001 --regid=10001 --init-groups "$role" "$@"
fi
exec "$role" "$@"
