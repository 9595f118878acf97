#!/bin/bash
# The leader's own link dies: netns_linkdown.sh with node 0 cut off. The leader hears none of
# the other nodes, and its record must say it lost them all (its own link the likely fault)
# rather than blame one of them; each of them logs losing the leader and fences itself.
# timeout: 60
# lane: side
set -euo pipefail
NETNS_LINKDOWN_CUT=0 exec "$(dirname "$0")/netns_linkdown.sh"
