#!/usr/bin/env python3
"""SASS checks for the attention kernels (hopper_attention.cuh): reads `cuobjdump -sass`
output and prints, per attn_fwd_kernel instantiation, the tensor-core / TMA instruction
counts, local-memory traffic, and whether the softmax really overlaps the P.V wgmma: the
number of MUFU.EX2 between `WARPGROUP.DEPBAR.LE gsb0, 0x1` (S_j is ready) and the next
`WARPGROUP.DEPBAR.LE gsb0, 0x0` (P.V done) must be the softmax's (>= BN/2 per thread).

usage: sass_check.py FILE.sass [...]     exit status 1 if a kernel fails a check
"""
import re
import sys

def demangle_cfg(name):
    m = re.search(r"AttnCfgILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb(\d)ELb(\d)ELb(\d)ELb(\d)E", name)
    if not m:
        return None
    k = ["D", "BN", "stages", "consumers", "in", "out", "causal", "overlap", "wgsync", "vperm"]
    return dict(zip(k, map(int, m.groups())))

def functions(text):
    cur, body = None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if cur:
                yield cur, body
            cur, body = m.group(1), []
        elif cur:
            body.append(line)
    if cur:
        yield cur, body

def main():
    bad = 0
    for path in sys.argv[1:]:
        text = open(path, errors="replace").read()
        for name, body in functions(text):
            cfg = demangle_cfg(name)
            if cfg is None or "attn_fwd" not in name:
                continue
            ins = [re.sub(r"/\*[0-9a-fx]+\*/", "", l).strip() for l in body if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
            mma = sum(1 for l in ins if "GMMA." in l)
            tma = sum(1 for l in ins if "UTMALDG" in l)
            local = sum(1 for l in ins if re.search(r"\b(LDL|STL)\b", l))
            # overlap: MUFU.EX2 between DEPBAR.LE 1 and the next DEPBAR.LE 0
            overlap_ex2 = None
            for i, l in enumerate(ins):
                if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in l:
                    n = 0
                    for l2 in ins[i + 1:]:
                        if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in l2:
                            break
                        if "MUFU.EX2" in l2:
                            n += 1
                    overlap_ex2 = n
                    break
            need = cfg["BN"] // 2
            ok_overlap = (not cfg["overlap"]) or (overlap_ex2 is not None and overlap_ex2 >= need)
            ok = ok_overlap and local == 0 and mma > 0 and tma >= 3
            bad += 0 if ok else 1
            desc = " ".join("%s=%d" % (k, v) for k, v in cfg.items())
            print("%-4s %-86s GMMA %3d UTMALDG %d LDL/STL %d ex2-under-PV %s (need >= %d)" % (
                "ok" if ok else "FAIL", desc, mma, tma, local,
                "-" if overlap_ex2 is None else overlap_ex2, need if cfg["overlap"] else 0))
    sys.exit(1 if bad else 0)

if __name__ == "__main__":
    main()
