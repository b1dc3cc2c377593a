#!/bin/sh
# netns-rsh.sh: Open MPI's remote-shell agent for tests/multihost.sh
# (mpirun --mca plm_rsh_agent tests/netns-rsh.sh). Open MPI calls it as it
# would call ssh: `netns-rsh.sh [options] HOST COMMAND...`, where COMMAND is
# one shell string that starts its daemon (orted) on HOST. HOST is one of
# the network namespaces tests/multihost.sh made, frmh-1 ... frmh-9 (its
# hostfile names them so); the command runs there, in a UTS namespace of its
# own whose host name is HOST. The host name matters: Open MPI keeps a
# daemon's session files under /tmp/ompi.HOSTNAME..., which daemons of one
# job on "hosts" with one name would share (and remove under each other),
# and it makes a rank's own gethostname agree with mpirun's "on node frmh-2".
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;
        *) break ;;
    esac
done
host=$1
shift
case "$host" in
    frmh-[1-9]) ;;
    *) echo "netns-rsh.sh: $host is not a host of tests/multihost.sh (frmh-1 to frmh-9)" >&2; exit 255 ;;
esac
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$host" "$*"
