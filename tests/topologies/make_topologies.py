#!/usr/bin/env python3
"""Makes the hwloc XML topologies the binding-plan tests run on.

Each is an `lstopo --input "<synthetic>" --of xml` machine with NVIDIA GPUs
(PCI class 0302, vendor 10de) added under the package or group whose NUMA
node they hang off, and optionally a smaller allowed cpuset (as a cgroup
would give). Run from anywhere; writes the .xml files beside this script.
Needs lstopo-no-graphics (Debian package hwloc).
"""
import os
import subprocess
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def linux_pu_indexes(cores, threads):
    """PU OS indexes as Linux numbers them on Intel: core c's threads are c, c+cores, ..."""
    return ",".join(str(c + t * cores) for c in range(cores) for t in range(threads))


def synthetic_xml(desc):
    out = subprocess.check_output(["lstopo-no-graphics", "--input", desc, "--of", "xml", "-"])
    return ET.ElementTree(ET.fromstring(out))


def objects(parent, kind):
    return [o for o in parent.iter("object") if o.get("type") == kind]


def add_gpus(tree, parent_kind, gpus):
    """gpus: list of (parent ordinal among `parent_kind` objects, pci bus id)."""
    parents = objects(tree.getroot(), parent_kind)
    gp = 100000
    for ordinal, busid in gpus:
        domain, bus, devfn = busid.split(":")
        bridge = ET.SubElement(parents[ordinal], "object", {
            "type": "Bridge", "gp_index": str(gp), "bridge_type": "0-1", "depth": "0",
            "bridge_pci": f"{domain}:[{bus}-{bus}]"})
        ET.SubElement(bridge, "object", {
            "type": "PCIDev", "gp_index": str(gp + 1), "pci_busid": busid,
            "pci_type": "0302 [10de:2330] [10de:16c1] a1", "pci_link_speed": "0.000000"})
        gp += 2


def set_allowed(tree, cpus):
    machine = tree.getroot().find("object")
    mask = 0
    for c in cpus:
        mask |= 1 << c
    words = []
    while True:  # hwloc writes 32-bit words, most significant first, comma-separated
        words.append(mask & 0xFFFFFFFF)
        mask >>= 32
        if not mask:
            break
    machine.set("allowed_cpuset", ",".join(f"0x{w:08x}" for w in reversed(words)))


def write(tree, name):
    path = os.path.join(HERE, name)
    tree.write(path, encoding="UTF-8", xml_declaration=True)
    print("wrote", path)


INCIDENT = f"pack:2 [numa] core:22 pu:2(indexes={linux_pu_indexes(44, 2)})"
INCIDENT_GPUS = [(0, "0000:02:00.0"), (0, "0000:03:00.0"), (1, "0000:81:00.0"), (1, "0000:82:00.0")]

# 1. The incident's server: 2 x 22 cores x 2 threads, a node per package, 2 GPUs per node.
t = synthetic_xml(INCIDENT)
add_gpus(t, "Package", INCIDENT_GPUS)
write(t, "incident.xml")

# 3. One package, one node, 8 GPUs.
t = synthetic_xml(f"pack:1 [numa] core:16 pu:2(indexes={linux_pu_indexes(16, 2)})")
add_gpus(t, "Package", [(0, b) for b in ["0000:1a:00.0", "0000:1b:00.0", "0000:3d:00.0", "0000:3e:00.0",
                                         "0000:88:00.0", "0000:89:00.0", "0000:b1:00.0", "0000:b2:00.0"]])
write(t, "one_node_8gpu.xml")

# 4. Two packages of four NUMA nodes each (EPYC NPS4), one GPU per node, bus ids not in node order.
t = synthetic_xml(f"pack:2 group:4 [numa] core:8 pu:2(indexes={linux_pu_indexes(64, 2)})")
NPS4 = ["0000:c1:00.0", "0000:81:00.0", "0000:e1:00.0", "0000:a1:00.0",
        "0000:41:00.0", "0000:01:00.0", "0000:61:00.0", "0000:21:00.0"]
add_gpus(t, "Group", list(enumerate(NPS4)))
write(t, "nps4_8gpu.xml")

# 5. No GPU at all: two nodes, CPU training.
t = synthetic_xml(f"pack:2 [numa] core:4 pu:2(indexes={linux_pu_indexes(8, 2)})")
write(t, "no_gpu.xml")

# 6. The incident's server under a cgroup: node 0 keeps cores 0-5, node 1 only core 22.
t = synthetic_xml(INCIDENT)
add_gpus(t, "Package", INCIDENT_GPUS)
allowed = [c for core in list(range(0, 6)) + [22] for c in (core, core + 44)]
set_allowed(t, allowed)
write(t, "incident_cgroup.xml")
