#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair (iproute2), each with its own
# host name (unshare --uts), and a 2-rank run of a test program across them over OpenMPI's TCP transport.
# mpirun starts in the first namespace; the second rank's daemon is started in the second one by a stand-in
# for ssh (OpenMPI's plm_rsh_agent), so the multi-host launch, the out-of-band wiring and the data path all
# go through the veth pair, as they would between machines.
#   tests/dist/two_hosts.sh MPIEXEC PROGRAM [ARGS...]
# Exit 77 (ctest: skipped) where namespaces cannot be made (not root, or a container without the right).
set -euo pipefail
mpiexec=$1
shift

if [[ "$(id -u)" -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "two_hosts: needs root and iproute2's ip; skipped"
  exit 77
fi
# ip netns exec remounts / (as a slave mount): in a chroot, whose / is no mount point, it cannot, and a
# namespace made there would leave its mount behind. A container may refuse new namespaces altogether.
if ! mountpoint -q / || ! unshare --net --mount true 2>/dev/null; then
  echo "two_hosts: no network namespaces here (a chroot, or a container without the right); skipped"
  exit 77
fi
a="frugal_a_$$"
b="frugal_b_$$"
work=$(mktemp -d)
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
if ! ip netns add "$a" 2>"$work/err" || ! ip netns add "$b" 2>>"$work/err"; then
  echo "two_hosts: cannot make network namespaces here ($(head -1 "$work/err")); skipped"
  exit 77
fi
# The last octet varies with the process id, so that two runs at once do not share addresses.
net="10.$((77 + $$ % 100)).$(($$ % 250)).0"
ip link add "va$$" netns "$a" type veth peer name "vb$$" netns "$b"
ip -n "$a" addr add "${net%.0}.1/24" dev "va$$"
ip -n "$b" addr add "${net%.0}.2/24" dev "vb$$"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va$$" up
ip -n "$b" link set "vb$$" up

# The stand-in for ssh: its first argument is the host, the rest the command line a remote shell would run.
cat >"$work/agent" <<AGENT
#!/usr/bin/env bash
host=\$1
shift
case "\$host" in
  ${net%.0}.1) exec ip netns exec "$a" unshare --uts sh -c "hostname host-a; \$*" ;;
  ${net%.0}.2) exec ip netns exec "$b" unshare --uts sh -c "hostname host-b; \$*" ;;
  *) echo "two_hosts: unknown host \$host" >&2; exit 1 ;;
esac
AGENT
chmod +x "$work/agent"

echo "two_hosts: ranks on ${net%.0}.1 (namespace $a) and ${net%.0}.2 (namespace $b), TCP over a veth pair"
ip netns exec "$a" unshare --uts sh -c 'hostname host-a; exec "$@"' sh \
  "$mpiexec" -np 2 --host "${net%.0}.1:1,${net%.0}.2:1" --mca plm_rsh_agent "$work/agent" \
  --mca btl self,tcp --mca btl_tcp_if_include "$net/24" --mca oob_tcp_if_include "$net/24" "$@"
