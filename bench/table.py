#!/usr/bin/python3
"""Summarise a bench/run results file: one table, then one RESULT line per
(op, W, size):

  RESULT op=<op> W=<w> pair_bytes=<n> ours_us=<t> anchor=<name> anchor_us=<t> ratio=<ours/anchor>

ours = daemon-to-daemon median op time (slowest rank per op); anchor = the
same operation in MPI over TCP, or for all-to-all kinds the best (fastest)
TCP anchor of the run (MPI_Alltoallv, Gloo, naive raw TCP). Also writes the
table as markdown (--md).
"""
import argparse
import collections
import os
import platform
import statistics
import sys

OPS = ["allreduce", "allgather", "reduce_scatter", "alltoall", "global_scatter"]
A2A_ANCHORS = [("mpi_alltoallv", "MPI_Alltoallv tcp"), ("gloo_alltoallv", "Gloo tcp"),
               ("raw_tcp_poll", "raw TCP poll")]
ANCHORS = {
    "allreduce": [("mpi_allreduce", "MPI_Allreduce tcp")],
    "allgather": [("mpi_allgather", "MPI_Allgather tcp")],
    "reduce_scatter": [("mpi_reduce_scatter", "MPI_Reduce_scatter_block tcp")],
    "alltoall": A2A_ANCHORS,
    "global_scatter": A2A_ANCHORS,
}


def kv(line):
    return dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)


def fmt_us(us):
    if us is None:
        return "-"
    if us >= 10000:
        return "%.1f ms" % (us / 1000)
    if us >= 1000:
        return "%.2f ms" % (us / 1000)
    return "%.0f us" % us if us >= 100 else "%.1f us" % us


def fmt_size(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)


def load(path):
    res = collections.defaultdict(list)  # (impl, transport, W, bytes) -> [med_us]
    iters = {}
    mem = {}
    load_ = {"busy": [], "steal": [], "rejected": 0,  # what else the machine did
             "cc": collections.defaultdict(set)}  # TCP congestion control, by side
    for line in open(path):
        if line.startswith("RESULT "):
            d = kv(line)
            key = (d["impl"], d["transport"], int(d["W"]), int(d["pair_bytes"]))
            res[key].append(float(d["med_us"]))
            iters[key] = int(d["iters"])
        elif line.startswith("MEMCPY "):
            d = kv(line)
            mem[d["size"]] = float(d["GBps"])
        elif line.startswith("TCPSTREAM_BEST "):
            d = kv(line)
            mem["tcp_" + d["size"]] = float(d["cpu_us"])
        elif line.startswith("BUSY "):
            load_["busy"].append(int(line.split()[1].split("=")[1].rstrip("%")))
        elif line.startswith("TCPCC "):
            for side, cc in kv(line).items():
                load_["cc"][side].add(cc)
        elif line.startswith("STEAL "):
            if " rejected " in line:
                load_["rejected"] += 1
            else:
                load_["steal"].append(int(kv(line)["pct"]))
    launches = max((len(v) for v in res.values()), default=0)
    return res, iters, mem, load_, launches


def mem_bw(mem, nbytes):
    """memcpy GB/s measured at this pair size (memcpy_bw's size names)."""
    name = "%dMiB" % (nbytes >> 20) if nbytes >= 1 << 20 else "%dKiB" % (nbytes >> 10)
    return mem.get(name)


def floor_us(W, S, mem):
    """Two-copy loopback floor of a uniform all-to-all: every byte that
    crosses ranks is copied twice (into the socket, out of it), the self
    chunk once, spread over min(W, cores) cores at memcpy speed."""
    bw = mem_bw(mem, S)
    if not bw:
        return None
    copied = 2 * W * (W - 1) * S + W * S
    return copied / (min(W, os.cpu_count() or 1) * bw * 1e9) * 1e6


def tcp_bound(W, S, mem):
    """The floor's multiple a TCP all-to-all reaches at best here: each byte
    crossing ranks costs what it cost one bare loopback stream
    (tcp_stream_cost's best CPU time per message of S bytes, both ends), k
    times its two copies at memcpy speed; the self chunk stays one copy;
    every CPU busy all the time."""
    bw, cpu_us = mem_bw(mem, S), mem.get("tcp_" + ("%dMiB" % (S >> 20)))
    if not bw or not cpu_us:
        return None
    k = cpu_us / (2 * S / (bw * 1e9) * 1e6)
    cross, self_ = 2 * W * (W - 1) * S, W * S
    return (cross * k + self_) / (cross + self_)


def rounds_won(res, op, anchors, W, S):
    """(won, rounds): rounds in which ours was no slower than the best
    anchor of the same round (bench/run runs them minutes apart at most)."""
    ours = res.get(("distd_" + op, "d2d", W, S), [])
    per = [res.get((name, "tcp", W, S), []) for name, _ in anchors]
    best = [min(v[i] for v in per if len(v) > i) for i in range(len(ours))
            if any(len(v) > i for v in per)]
    return sum(o <= b for o, b in zip(ours, best)), len(best)


def build(res, iters, mem, ops):
    med = {k: statistics.median(v) for k, v in res.items()}
    rows, results = [], []
    keys = sorted({(k[2], k[3]) for k in med})
    for op in ops:
        anchors = ANCHORS[op]
        a2a = op in ("alltoall", "global_scatter")
        for W, S in keys:
            ours = med.get(("distd_" + op, "d2d", W, S))
            e2e = med.get(("distd_" + op, "e2e", W, S))
            avals = [(name, label, med.get((name, "tcp", W, S))) for name, label in anchors]
            present = [(n, v) for n, _, v in avals if v is not None]
            if ours is None and not present:
                continue
            best = min(present, key=lambda p: p[1]) if present else None
            ratio = ours / best[1] if ours is not None and best else None
            big = a2a and S >= 16 << 20
            fl = floor_us(W, S, mem) if big else None
            rows.append({"op": op, "W": W, "S": S, "ours": ours, "e2e": e2e,
                         "anchors": avals, "best": best, "ratio": ratio, "floor": fl,
                         "bound": tcp_bound(W, S, mem) if big else None,
                         "won": rounds_won(res, op, anchors, W, S),
                         "iters": iters.get(("distd_" + op, "d2d", W, S))})
            if ours is not None and best:
                results.append("RESULT op=%s W=%d pair_bytes=%d ours_us=%.1f anchor=%s "
                               "anchor_us=%.1f ratio=%.2f" % (op, W, S, ours, best[0], best[1],
                                                               ratio))
    return rows, results


def render(rows):
    hdr = ["op", "W", "pair", "ours d2d", "ours e2e", "anchors (TCP)", "ratio d2d/best",
           "rounds won", "d2d/floor", "TCP bound/floor"]
    table = []
    for r in rows:
        anchors = ", ".join("%s %s" % (label, fmt_us(v)) for _, label, v in r["anchors"])
        table.append([r["op"], str(r["W"]), fmt_size(r["S"]), fmt_us(r["ours"]),
                      fmt_us(r["e2e"]), anchors,
                      "%.2f" % r["ratio"] if r["ratio"] is not None else "-",
                      "%d/%d" % r["won"] if r["won"][1] else "-",
                      "%.2f" % (r["ours"] / r["floor"]) if r["floor"] and r["ours"] else "-",
                      "%.2f" % r["bound"] if r["bound"] else "-"])
    w = [max(len(x[i]) for x in [hdr] + table) for i in range(len(hdr))]
    out = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(hdr)) + " |",
           "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    for x in table:
        out.append("| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(x)) + " |")
    return out


def load_notes(load_):
    n, busy, steal, cc = [], load_["busy"], load_["steal"], load_["cc"]
    if cc:
        n.append("TCP congestion control: the anchors %s (the system's), distd's peer "
                 "sockets %s (peer_congestion)." % ("/".join(sorted(cc["system"])) or "?",
                                                  "/".join(sorted(cc["distd"])) or "?"))
    if busy:
        n.append("other load before launches (CPU busy%%): median %d%%, max %d%% over %d "
                 "launches." % (statistics.median(busy), max(busy), len(busy)))
        if statistics.median(busy) > 50:
            n.append("WARNING: the machine was busy with other work during this run (median "
                     "%d%% CPU busy before launches): busy-polling MPI suffers most from "
                     "oversubscription, so ratios here are not reliable; rerun when quiet."
                     % statistics.median(busy))
    if steal or load_["rejected"]:
        n.append("CPU time the hypervisor withheld from this VM during the kept launches "
                 "(steal): median %d%%, max %d%%; %d launches (ours or anchors) ran again "
                 "because steal exceeded bench/run's STEAL_MAX."
                 % (statistics.median(steal or [0]), max(steal or [0]), load_["rejected"]))
    return n


def notes(rows, mem, load_, e2e_big, launches):
    its = sorted({r["iters"] for r in rows if r["iters"] and r["S"] >= 16 << 20})
    n = ["Method (../shared/docs/performance.md): per case 1 op checked byte by byte, 3 "
         "warm-ups, then >= 20 timed ops (about TARGET seconds), each after a barrier; op "
         "time = slowest rank; median. d2d = timed inside the daemons (benchmark mode of the "
         "Collective RPC, no client); e2e = what SPMD trainers see, one thread per rank "
         "calling its own daemon (client -> daemon -> peers -> back; all-to-all kinds only).",
         "pair = bytes one rank owes each rank: alltoall/global_scatter send pair to every "
         "rank (self too); allgather contributes pair; reduce_scatter gives W*pair, keeps "
         "pair; allreduce reduces a W*pair buffer (float32 sum). global_scatter = one expert "
         "per rank, uniform counts, through the MoE exchange (moe_scatter.c); its e2e runs "
         "the Moe.GlobalScatter RPC.",
         "ratio = ours d2d / best TCP anchor of this run (MPI op over btl tcp; for all-to-all "
         "kinds the fastest of MPI_Alltoallv, Gloo, raw TCP). floor = two-copy loopback floor "
         "(2*W*(W-1)*pair + W*pair bytes at memcpy speed over min(W, %d cores)). TCP "
         "bound = the floor's multiple a TCP all-to-all would reach if every byte crossing "
         "ranks cost what it cost one bare loopback stream (bench/anchors/tcp_stream_cost: "
         "best CPU time per 16 MiB of a sender and a receiver on their own CPUs, over write "
         "sizes and socket buffers) against two memcpy copies, the self chunk one copy, and "
         "every CPU were busy all the time. Both figures are measured at the end of the run "
         "and move with the machine (memcpy 12.9-19.9 GB/s in one hour)."
         % (os.cpu_count() or 1),
         "placement: each of our daemons runs on its own CPU, round robin (`distctl cluster "
         "up --pin`, distd's cpu_affinity; PIN=0 turns it off); the anchors run where their "
         "launchers put them (pinned the same way, the raw-TCP anchor was not faster: "
         "docs/performance-notes.md, eleventh round)."]
    if launches > 1:
        n.append("each cell: median over %d launches of the case (bench/run ROUNDS), ours "
                 "and the anchors alternating, each launch's figure being its own median. "
                 "rounds won = rounds in which ours was no slower than the best anchor of "
                 "the same round (each op's launch is followed at once by its anchors')."
                 % launches)
    if its:
        n.append("16 MiB: %s timed ops per case (the method's minimum of 20 when one op is "
                 "long), fewer than at small sizes." % "/".join(map(str, its)))
    if e2e_big:
        n.append("e2e at 16 MiB: %d timed ops only (each moves W*16 MiB through gRPC both "
                 "ways and takes a long time); e2e is a trainer's view, not a target." % e2e_big)
    copies = [(k, v) for k, v in mem.items() if not k.startswith("tcp_")]
    if copies:
        n.append("memcpy (1 thread): " + ", ".join("%s %.1f GB/s" % kv_ for kv_ in copies))
    for k, v in mem.items():
        if k.startswith("tcp_"):
            n.append("one bare loopback TCP stream, best of tcp_stream_cost's settings: %.0f us "
                     "of CPU (sender + receiver) per %s." % (v, k[4:]))
    return n + load_notes(load_)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--ops", default=" ".join(OPS))
    ap.add_argument("--md")
    ap.add_argument("--cmd", default="bench/run")
    ap.add_argument("--stamp", default="")
    ap.add_argument("--e2e-big", type=int, default=0)
    a = ap.parse_args()
    res, iters, mem, load_, launches = load(a.results)
    rows, results = build(res, iters, mem, [o for o in a.ops.split() if o in ANCHORS])
    table, nts = render(rows), notes(rows, mem, load_, a.e2e_big, launches)
    print("\n".join(table))
    print()
    for x in nts:
        print("- " + x)
    print()
    print("\n".join(results))
    if a.md:
        with open(a.md, "w") as f:
            f.write("# Collectives benchmark, %s\n\n" % a.stamp)
            f.write("`%s` on %s (%d cores, %s), loopback only.\n\n"
                    % (a.cmd.strip(), platform.node(), os.cpu_count() or 1, platform.release()))
            f.write("\n".join(table) + "\n\n")
            f.write("\n".join("- " + x for x in nts) + "\n\n```\n")
            f.write("\n".join(results) + "\n```\n")
        print("\n(table written to %s)" % a.md, file=sys.stderr)


if __name__ == "__main__":
    main()
