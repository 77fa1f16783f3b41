#!/usr/bin/env bash
# `loader topo` end to end: the incident's server from its topology file, GPU
# subsets through CUDA_VISIBLE_DEVICES, a cgroup-limited machine, and this
# machine itself (with taskset). Usage: loader_topo_cli_test.sh LOADER TOPOLOGY_DIR
set -uo pipefail
L=$1
T=$2
. "$(dirname "$0")/cli_lib.sh"

unset CUDA_VISIBLE_DEVICES
expect_rc 0 "topo on the incident's server" "$L" topo --topology "$T/incident.xml" --nproc-per-node 4
expect_text "[Affinity][Rank 0] local_rank=0 gpu=0 (0000:02:00.0) numa_node=0 trainer_cpus=0 loader_cpus=1-10,45-54 mem_node=0" "rank 0 on node 0"
expect_text "[Affinity][Rank 1] local_rank=1 gpu=1 (0000:03:00.0) numa_node=0 trainer_cpus=11 loader_cpus=12-21,56-65 mem_node=0" "rank 1 on the other half of node 0"
expect_text "[Affinity][Rank 2] local_rank=2 gpu=2 (0000:81:00.0) numa_node=1 trainer_cpus=22 loader_cpus=23-32,67-76 mem_node=1" "rank 2 on node 1"
expect_text "[Affinity][Rank 3] local_rank=3 gpu=3 (0000:82:00.0) numa_node=1 trainer_cpus=33 loader_cpus=34-43,78-87 mem_node=1" "rank 3 on the other half of node 1"
expect_text "GPU3  0000:82:00.0   1          22-43,66-87" "map shows each GPU's node and cpus"

expect_rc 0 "topo --json" "$L" topo --topology "$T/incident.xml" --nproc-per-node 4 --json
cp "$W/out" "$W/plan.json"
expect_rc 0 "--json matches the schema" $PY - "$W/plan.json" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert [n["os_index"] for n in j["numa_nodes"]] == [0, 1]
assert all(isinstance(c, int) for n in j["numa_nodes"] for c in n["cpus"])
assert [(g["index"], g["pci"], g["numa_node"]) for g in j["gpus"]] == [
    (0, "0000:02:00.0", 0), (1, "0000:03:00.0", 0), (2, "0000:81:00.0", 1), (3, "0000:82:00.0", 1)]
for r in j["ranks"]:
    for k in ("local_rank", "gpu", "pci", "numa_node", "trainer_cpus", "loader_cpus", "mem_node"):
        assert k in r, k
r3 = j["ranks"][3]
assert r3["trainer_cpus"] == [33] and r3["loader_cpus"] == list(range(34, 44)) + list(range(78, 88))
PYEOF

CUDA_VISIBLE_DEVICES=1,3 expect_rc 0 "CUDA_VISIBLE_DEVICES=1,3" "$L" topo --topology "$T/incident.xml"
expect_text "[Affinity][Rank 1] local_rank=1 gpu=1 (0000:82:00.0) numa_node=1" "visible GPU 1 is the PCI 82:00.0 on node 1"
CUDA_VISIBLE_DEVICES=3,2,1,0 expect_rc 0 "CUDA_VISIBLE_DEVICES reordered" "$L" topo --topology "$T/incident.xml"
expect_text "[Affinity][Rank 0] local_rank=0 gpu=0 (0000:82:00.0) numa_node=1" "reordered GPU 0 is 82:00.0"
expect_rc 1 "more ranks than GPUs" "$L" topo --topology "$T/incident.xml" --nproc-per-node 6
expect_text "6 local ranks but only 4 visible GPUs" "names both counts"
expect_rc 1 "too few allowed cores" "$L" topo --topology "$T/incident_cgroup.xml" --nproc-per-node 4
expect_text "NUMA node 1 has 1 allowed core (22,66) for 2 local ranks (2,3)" "error names the node, cores and ranks"
expect_rc 0 "--allow-shared-cores" "$L" topo --topology "$T/incident_cgroup.xml" --nproc-per-node 4 --allow-shared-cores
expect_text "cores shared" "the shared plan says so"

# This machine, as it is.
expect_rc 0 "topo on this machine" "$L" topo --nproc-per-node 2
expect_text "machine: this machine" "shows the live map"
expect_text "[Affinity][Rank 1] local_rank=1" "plans 2 ranks"
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  expect_rc 0 "topo under taskset" taskset -c 1 "$L" topo --json
  cp "$W/out" "$W/live.json"
  expect_rc 0 "allowed cpus follow taskset" $PY -c "import json; j=json.load(open('$W/live.json')); assert j['allowed_cpus']==[1], j['allowed_cpus']; assert j['ranks'][0]['loader_cpus']==[1]"
fi
expect_rc 1 "missing topology file" "$L" topo --topology "$W/none.xml"
expect_text "none.xml" "error names the file"

# Numbers from the environment and flags: checked, never std::terminate.
expect_rc 0 "a 20-digit CUDA_VISIBLE_DEVICES entry ends the list, as in CUDA" \
  env CUDA_VISIBLE_DEVICES=99999999999999999999999 "$L" topo --topology "$T/incident.xml" --nproc-per-node 1
expect_text "entry '99999999999999999999999' is not a GPU index (4 GPUs in PCI order); CUDA ignores it" "and says so"
expect_rc 105 "a 20-digit --gpus entry is an error naming the flag" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --gpus 99999999999999999999
expect_text "in --gpus '99999999999999999999'" "names --gpus and quotes it"
expect_rc 1 "a cpu list of a billion cpus is refused without allocating" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --cpu-affinity 0-999999999
expect_text "cpu indices are 0..65535" "states the bound"
expect_rc 105 "--nproc-per-node 2147483647 is refused" "$L" topo --nproc-per-node 2147483647
# Fallbacks are notes, contradictions errors (no silent fallback).
expect_rc 0 "--trainer-cores 65535" "$L" topo --topology "$T/incident.xml" --nproc-per-node 4 --trainer-cores 65535
expect_text "note: --trainer-cores 65535: local ranks 0-3 have too few cores for that; each trainer got 1 cpu" "the shortfall is a note"
expect_rc 0 "CUDA_VISIBLE_DEVICES set but empty" env CUDA_VISIBLE_DEVICES= "$L" topo --topology "$T/incident.xml" --nproc-per-node 1
expect_text "note: CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible" "is a note"
expect_rc 1 "--ignore-gpus --gpus 0" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --ignore-gpus --gpus 0
expect_text "--gpus '0' and --ignore-gpus contradict" "names --ignore-gpus"
expect_rc 1 "--no-bind --numa-node 5" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --no-bind --numa-node 5
expect_text "--numa-node and --no-bind contradict" "names both flags"
expect_rc 1 "--no-bind --cpu-affinity 0-3" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --no-bind --cpu-affinity 0-3
expect_text "--cpu-affinity and --no-bind contradict" "names both flags"
expect_rc 1 "--no-bind --trainer-cores 2" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --no-bind --trainer-cores 2
expect_text "--trainer-cores and --no-bind contradict" "names both flags"
expect_rc 0 "topo --json has gpu_note" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --json
cp "$W/out" "$W/note.json"
expect_rc 0 "gpu_note is a string" $PY -c "import json; j=json.load(open('$W/note.json')); assert isinstance(j['gpu_note'], str), j.keys()"

# Rank lists stay short: 1024 ranks make one note and short errors.
expect_rc 1 "1024 ranks on 88 cpus" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1024 --ignore-gpus
expect_text "for 512 local ranks (0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,... (512 ranks))" "the error lists the ranks briefly"
expect_rc 0 "1024 ranks, --allow-shared-cores" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1024 --ignore-gpus --allow-shared-cores
expect_text "note: --allow-shared-cores: local ranks 0-1023 share their cores" "one note for all ranks"
expect_rc 0 "one shared-cores note line" test "$(grep -c -- '--allow-shared-cores: local' "$W/out")" -eq 1

# A cpu list repeating its whole range is a set of bits (it took 530 MB and 7.7 s).
big=$($PY -c "print(','.join(['0-65535']*2000))")
expect_rc 1 "a cpu list repeating 0-65535 2000 times" "$L" topo --topology "$T/incident.xml" --nproc-per-node 1 --cpu-affinity "$big"
expect_text "uses cpus 88-65535 that this process may not use" "is parsed and checked"
finish
