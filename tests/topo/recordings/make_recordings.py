"""Writes the NVML + sysfs recordings used by tests/topo (run once: python make_recordings.py).

The answers are transcribed from public records of real machines; what could
not be found is marked SYNTHETIC in each recording's ``source`` and is chosen
only to be consistent (distinct, ascending) — tests never depend on its value.

* DGX H100: GPU bus ids 1B, 43, 52, 61, 9D, C3, D1, DF (nvidia-smi on DGX H100,
  e.g. the DGX H100 user guide's GPU table / `nvidia-smi -q`); NIC bus ids and
  RDMA names from the DGX H100 user guide §1.2.3 Table 6 (netdev ibp24s0 = bus
  0x18 ...); 18 NVLinks split 5/5/4/4 over 4
  NVSwitches (every H100/H200 NCCL topology dump, e.g. Azure ndv5-topo.xml); NVLink version enum 6 =
  NVLink 4.0 (nvml.h); HBM3 max memory clock 2619 MHz x 5120-bit bus (nvidia-smi
  -q "Max Clocks: Memory 2619 MHz"); Xeon 8480C = family 6 model 143 (Azure NDv5
  NCCL file: familyid 6 modelid 143); NUMA cpulists as in the shipped YAML.
  SYNTHETIC: NVSwitch bus ids, switch/root-port bus numbers, UUIDs.
* DGX A100: GPU bus ids 07, 0F, 47, 4E, 87, 90, B7, BD and NUMA 3,3,1,1,7,7,5,5
  (nvidia-smi topo -m of a DGX A100: tests/fixtures/smi/dgx-a100.txt, NUMA
  affinity column); 12 NVLinks, 2 to each of 6 NVSwitches (NCCL dumps with six
  count="2" targets, nccl#1505); version enum 5 (hwloc#658: "A100 returns 5");
  AMD EPYC 7742 = family 23 model 49 (Azure NDv4 NCCL file); HDR 200 Gb/s
  ConnectX-6; 1215 MHz x 5120-bit HBM2 (1555 GB/s datasheet).
  SYNTHETIC: NIC and switch bus numbers (mlx5 numbering follows PCI order).
* H200 VM (nccl-tests#256): NVSwitches not passed through, every remote bus id
  FFFFFFFF:FF:FF.0 (NCCL writes fffffff:ff:ff.0), numa_node -1, PCIe at 16 GT/s
  of 32 GT/s. SYNTHETIC: VM bus ids (one root port per GPU), UUIDs.
* PCIe box (8x RTX 3090, Xeon E5 v4; tests/fixtures/smi/rtx3090-8-pcie-xeon-e5v4.txt:
  GPU pairs PIX, pairs of pairs PHB, sockets SYS; affinity 0-13,28-41 / 14-27,42-55):
  no NVLink (NVML NOT_SUPPORTED on link 0), P2P "GNS" (GeForce), PCIe Gen3 x16;
  E5-2680 v4 = family 6 model 79; GDDR6X 9751 MHz x 384-bit (936 GB/s).
  SYNTHETIC: bus ids.
* GB200 tray (4 GPUs, NVIDIA Multi-Node Tuning Guide: NV18 among them, GPU NUMA IDs, CPU affinity
  0-71 / 72-143 per sglang#11208; NCCL sees one invisible NVLink target with
  count 18 per GPU): link 18 answers INVALID_ARGUMENT (TensorRT-LLM PR #17060);
  fabric info V with a cluster UUID and clique id (state 3 = COMPLETED); C2C
  fields 170/172. SYNTHETIC: C2C count 10 x 22500 MB/s (225 GB/s per direction,
  the shipped YAML's figure; real field values not found), bus ids, UUIDs.
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
FULL = {"state": 1}


def gpu(i, bus, name, cc, mem, clk, width, links, link_error, affinity, **kw):
    short_domain = bus.count(":") == 2 and len(bus.split(":")[0]) == 4  # NVML spells the domain with 8 digits
    return {
        "busId": bus.upper().replace("0000:", "00000000:", 1) if short_domain else bus,
        "uuid": f"GPU-{i:08x}-0000-4000-8000-{0xABC000 + i:012x}",
        "name": name,
        "cc": cc,
        "memory": mem,
        "mem_clock_mhz": clk,
        "mem_bus_width": width,
        "links": links,
        "link_error": link_error,
        "cpu_affinity": affinity,
        **kw,
    }


def pcidev(path, cls, numa, speed, width, cur_speed=None, cur_width=None):
    return {
        "path": path,
        "class": cls,
        "numa": numa,
        "max_link_speed": speed,
        "max_link_width": width,
        "current_link_speed": cur_speed or speed,
        "current_link_width": cur_width or width,
    }


def dgx_h100():
    gpu_bus = [0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF]
    nic_bus = [0x18, 0x40, 0x4F, 0x5E, 0x9A, 0xC0, 0xCE, 0xDC]
    names = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    sw = [f"00000000:{b:02X}:00.0" for b in (0x05, 0x06, 0x07, 0x08)]
    split = [0] * 5 + [1] * 5 + [2] * 4 + [3] * 4
    aff = ["0-55,112-167", "56-111,168-223"]
    g5 = "32.0 GT/s PCIe"
    pci, ib, net, gpus = [], [], [], []
    for k in range(8):
        rc = nic_bus[k] - 3
        root = [f"pci0000:{rc:02x}", f"0000:{rc:02x}:01.0", f"0000:{rc + 1:02x}:00.0"]
        numa = k // 4
        pci.append(pcidev(root, "0x060400", numa, g5, 16))
        pci.append(pcidev(root + [f"0000:{rc + 2:02x}:00.0", f"0000:{nic_bus[k]:02x}:00.0"], "0x020700", numa, g5, 16))
        pci.append(pcidev(root + [f"0000:{rc + 2:02x}:01.0", f"0000:{gpu_bus[k]:02x}:00.0"], "0x030200", numa, g5, 16))
        ib.append({"name": names[k], "pci": f"0000:{nic_bus[k]:02x}:00.0", "rate": "400 Gb/sec (4X NDR)"})
        net.append({"name": f"ibp{nic_bus[k]}s0", "pci": f"0000:{nic_bus[k]:02x}:00.0", "speed": 400000})
        links = [{"state": 1, "version": 6, "remote": sw[split[link]], "type": 2} for link in range(18)]
        gpus.append(
            gpu(
                k,
                f"00000000:{gpu_bus[k]:02X}:00.0",
                "NVIDIA H100 80GB HBM3",
                [9, 0],
                85520809984,
                2619,
                5120,
                links,
                "invalid_argument",
                aff[numa],
            )
        )
    return {
        "source": __doc__.split("* DGX H100:")[1].split("* DGX A100:")[0].strip(),
        "yaml": "dgx-h100",
        "host": "h0",
        "nvml": {"gpus": gpus, "p2p": [[0] * 8 for _ in range(8)]},
        "sysfs": {
            "cpuinfo": "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
            "model name\t: Intel(R) Xeon(R) Platinum 8480C",
            "nodes": {"0": aff[0], "1": aff[1]},
            "sockets": {"0": 0, "56": 1},
            "pci": pci,
            "ib": ib,
            "net": net,
        },
    }


def dgx_a100():
    gpu_bus = [0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD]
    nic_bus = [0x0C, 0x12, 0x4B, 0x54, 0x61, 0x62, 0x8D, 0x94, 0xBA, 0xCC, 0xE1, 0xE2]
    numa_gpu = [3, 3, 1, 1, 7, 7, 5, 5]
    nodes = {n: f"{16 * n}-{16 * n + 15},{128 + 16 * n}-{128 + 16 * n + 15}" for n in range(8)}
    g4 = "16.0 GT/s PCIe"
    sw = [f"00000000:{b:02X}:00.0" for b in range(0xC4, 0xCA)]
    pci, ib, gpus = [], [], []
    # switch groups in the order of the shipped YAML (bus numbers of switches SYNTHETIC, ascending)
    groups = [
        (3, [0, 1], [0, 1], 0x01),
        (1, [2, 3], [2, 3], 0x41),
        (2, [], [4, 5], 0x5D),
        (7, [4, 5], [6, 7], 0x81),
        (5, [6, 7], [8, 9], 0xB1),
        (6, [], [10, 11], 0xDD),
    ]
    for numa, gs, ns, base in groups:
        top = [f"pci0000:{base:02x}", f"0000:{base:02x}:01.0", f"0000:{base + 1:02x}:00.0"]
        pci.append(pcidev(top, "0x060400", numa, g4, 16))
        if not gs:  # storage NICs: both on the top switch
            for j, n in enumerate(ns):
                pci.append(
                    pcidev(
                        top + [f"0000:{base + 2:02x}:{j:02x}.0", f"0000:{nic_bus[n]:02x}:00.0"],
                        "0x020700",
                        numa,
                        g4,
                        16,
                    )
                )
            continue
        devs = [(b, "0x030200") for b in (gpu_bus[i] for i in gs)] + [(nic_bus[n], "0x020700") for n in ns]
        for j, (bus, cls) in enumerate(devs):
            child = top + [f"0000:{base + 2:02x}:{j:02x}.0", f"0000:{base + 3 + j:02x}:00.0"]
            pci.append(pcidev(child, "0x060400", numa, g4, 16))
            leaf = [f"0000:{base + 3 + j:02x}:{0x10:02x}.0", f"0000:{bus:02x}:00.0"]
            pci.append(pcidev(child + leaf, cls, numa, g4, 16))
    for n in range(12):
        ib.append({"name": f"mlx5_{n}", "pci": f"0000:{nic_bus[n]:02x}:00.0", "rate": "200 Gb/sec (4X HDR)"})
    for k in range(8):
        links = [{"state": 1, "version": 5, "remote": sw[link // 2], "type": 2} for link in range(12)]
        gpus.append(
            gpu(
                k,
                f"00000000:{gpu_bus[k]:02X}:00.0",
                "NVIDIA A100-SXM4-40GB",
                [8, 0],
                42949672960,
                1215,
                5120,
                links,
                "invalid_argument",
                nodes[numa_gpu[k]],
            )
        )
    return {
        "source": __doc__.split("* DGX A100:")[1].split("* H200 VM")[0].strip(),
        "yaml": "dgx-a100",
        "host": "h0",
        "nvml": {"gpus": gpus, "p2p": [[0] * 8 for _ in range(8)]},
        "sysfs": {
            "cpuinfo": "vendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 49\n"
            "model name\t: AMD EPYC 7742 64-Core Processor",
            "nodes": {str(n): c for n, c in nodes.items()},
            "sockets": {str(16 * n): n // 4 for n in range(8)},
            "pci": pci,
            "ib": ib,
        },
    }


def h200_vm():
    pci, gpus = [], []
    for k in range(8):
        bus = 0x0A + k
        pci.append(
            pcidev(
                ["pci0000:00", f"0000:00:{2 + k:02x}.0", f"0000:{bus:02x}:00.0"],
                "0x030200",
                -1,
                "32.0 GT/s PCIe",
                16,
                cur_speed="16.0 GT/s PCIe",
            )
        )
        links = [{"state": 1, "version": 6, "remote": "FFFFFFFF:FF:FF.0"} for _ in range(18)]
        gpus.append(
            gpu(
                k,
                f"00000000:{bus:02X}:00.0",
                "NVIDIA H200",
                [9, 0],
                150754820096,
                3201,
                6144,
                links,
                "invalid_argument",
                "0-95",
            )
        )
    return {
        "source": __doc__.split("* H200 VM")[1].split("* PCIe box")[0].strip(),
        "yaml": None,
        "host": "vm0",
        "nvml": {"gpus": gpus, "p2p": [[0] * 8 for _ in range(8)]},
        "sysfs": {
            "cpuinfo": "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143",
            "nodes": {"0": "0-95"},
            "pci": pci,
        },
    }


def pcie_box():
    aff = ["0-13,28-41", "14-27,42-55"]
    pci, gpus = [], []
    for k in range(8):
        numa, pair = k // 4, k // 2
        rc = 0x00 if numa == 0 else 0x80
        bus = rc + 0x04 + 4 * (pair % 2) + (k % 2)
        up = [f"pci0000:{rc:02x}", f"0000:{rc:02x}:{2 + pair % 2:02x}.0", f"0000:{rc + 2 + pair % 2:02x}:00.0"]
        pci.append(pcidev(up, "0x060400", numa, "8 GT/s", 16))
        pci.append(
            pcidev(up + [f"0000:{rc + 0x10 + k:02x}:00.0", f"0000:{bus:02x}:00.0"], "0x030000", numa, "8 GT/s", 16)
        )
        gpus.append(
            gpu(
                k,
                f"00000000:{bus:02X}:00.0",
                "NVIDIA GeForce RTX 3090",
                [8, 6],
                25769803776,
                9751,
                384,
                [],
                "not_supported",
                aff[numa],
            )
        )
    p2p = [[0 if a == b else 2 for b in range(8)] for a in range(8)]
    return {
        "source": __doc__.split("* PCIe box")[1].split("* GB200 tray")[0].strip(),
        "yaml": "pcie-8gpu",
        "host": "h0",
        "nvml": {"gpus": gpus, "p2p": p2p},
        "sysfs": {
            "cpuinfo": "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 79\n"
            "model name\t: Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz",
            "nodes": {"0": aff[0], "1": aff[1]},
            "sockets": {"0": 0, "14": 1},
            "pci": pci,
        },
    }


def gb200_tray():
    doms = [0x0008, 0x0009, 0x0018, 0x0019]
    nic_doms = [0x0000, 0x0002, 0x0010, 0x0012]
    aff = ["0-71", "72-143"]
    pci, ib, gpus = [], [], []
    for k in range(4):
        numa = k // 2
        pci.append(
            pcidev(
                [f"pci{doms[k]:04x}:00", f"{doms[k]:04x}:00:00.0", f"{doms[k]:04x}:01:00.0"],
                "0x030200",
                numa,
                "32.0 GT/s PCIe",
                16,
            )
        )
        nb = f"{nic_doms[k]:04x}:03:00.0"
        pci.append(
            pcidev(
                [f"pci{nic_doms[k]:04x}:00", f"{nic_doms[k]:04x}:00:00.0", nb], "0x020700", numa, "32.0 GT/s PCIe", 16
            )
        )
        ib.append({"name": f"mlx5_{k}", "pci": nb, "rate": "400 Gb/sec (4X NDR)"})
        links = [{"state": 1, "version": 7, "remote": "FFFFFFFF:FF:FF.0", "type": 2} for _ in range(18)]
        gpus.append(
            gpu(
                k,
                f"{doms[k]:08X}:01:00.0",
                "NVIDIA GB200",
                [10, 0],
                199715979264,
                3996,
                8192,
                links,
                "invalid_argument",
                aff[numa],
                numa_node_id=[2, 10, 18, 26][k],
                fabric={"clusterUuid": "8f1a7c2e-6b4d-4e3a-9c5f-0123456789ab", "cliqueId": 32766, "state": 3},
                c2c=[10, 22500],
            )
        )
    return {
        "source": __doc__.split("* GB200 tray")[1].split('"""')[0].strip(),
        "yaml": "gb200-nvl72",
        "host": "tray0",
        "nvml": {"gpus": gpus, "p2p": [[0] * 4 for _ in range(4)]},
        "sysfs": {
            "cpuinfo": "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU architecture: 8",
            "nodes": {"0": aff[0], "1": aff[1]},
            "sockets": {"0": 0, "72": 1},
            "pci": pci,
            "ib": ib,
        },
    }


if __name__ == "__main__":
    for name, fn in (
        ("dgx-h100", dgx_h100),
        ("dgx-a100", dgx_a100),
        ("h200-vm", h200_vm),
        ("pcie-8gpu", pcie_box),
        ("gb200-tray", gb200_tray),
    ):
        (HERE / f"{name}.json").write_text(json.dumps(fn(), indent=1) + "\n")
        print("wrote", name)
