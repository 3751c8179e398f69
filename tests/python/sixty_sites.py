"""A training-like Python program with 60 leaking call sites:
3,600 allocations through the simulated runtime by ctypes, 2,445 blocks
leaked, as users' programs are. The HTML page of its report must stay
readable: the timeline follows the sites that matter, interpreter frames
are folded away, labels never overlap.

    python3 sixty_sites.py

Sites are functions layerNN_<op>_<pass>, one cudaMalloc line each
(marked "# SITE"). Over 60 steps:
  sites  0-19  one block a step, all kept: site i holds 60 x (20 - i)^2 x 1200
               bytes (site 0: 27.5 MiB, site 19: 70.3 KiB)
  sites 20-39  one block a step, every other one freed: 30 kept of (40 - i)^2 KiB
  sites 40-49  a burst of 1 MiB blocks in steps 36-47 (5 a step), freed at
               step 48 but for 5 each (sites 40-44) or 4 (45-49): the peak
  sites 50-59  two blocks of 512 KiB a step from step 30 on, all kept: they
               grow late, and are the largest at the end
3,600 allocations; 1,200 + 600 + 45 + 600 = 2,445 blocks leaked.
"""

import ctypes
import time

import sim

RT = sim.RT
KIB = 1024
MIB = 1024 * KIB


def check(rc):
    assert rc == 0, rc


def layer00_conv_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 0
    return p

def layer01_norm_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 1
    return p

def layer02_attn_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 2
    return p

def layer03_mlp_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 3
    return p

def layer04_proj_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 4
    return p

def layer05_embed_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 5
    return p

def layer06_conv_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 6
    return p

def layer07_norm_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 7
    return p

def layer08_attn_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 8
    return p

def layer09_mlp_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 9
    return p

def layer10_proj_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 10
    return p

def layer11_embed_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 11
    return p

def layer12_conv_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 12
    return p

def layer13_norm_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 13
    return p

def layer14_attn_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 14
    return p

def layer15_mlp_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 15
    return p

def layer16_proj_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 16
    return p

def layer17_embed_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 17
    return p

def layer18_conv_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 18
    return p

def layer19_norm_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 19
    return p

def layer20_attn_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 20
    return p

def layer21_mlp_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 21
    return p

def layer22_proj_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 22
    return p

def layer23_embed_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 23
    return p

def layer24_conv_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 24
    return p

def layer25_norm_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 25
    return p

def layer26_attn_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 26
    return p

def layer27_mlp_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 27
    return p

def layer28_proj_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 28
    return p

def layer29_embed_forward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 29
    return p

def layer00_conv_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 30
    return p

def layer01_norm_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 31
    return p

def layer02_attn_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 32
    return p

def layer03_mlp_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 33
    return p

def layer04_proj_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 34
    return p

def layer05_embed_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 35
    return p

def layer06_conv_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 36
    return p

def layer07_norm_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 37
    return p

def layer08_attn_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 38
    return p

def layer09_mlp_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 39
    return p

def layer10_proj_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 40
    return p

def layer11_embed_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 41
    return p

def layer12_conv_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 42
    return p

def layer13_norm_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 43
    return p

def layer14_attn_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 44
    return p

def layer15_mlp_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 45
    return p

def layer16_proj_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 46
    return p

def layer17_embed_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 47
    return p

def layer18_conv_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 48
    return p

def layer19_norm_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 49
    return p

def layer20_attn_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 50
    return p

def layer21_mlp_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 51
    return p

def layer22_proj_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 52
    return p

def layer23_embed_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 53
    return p

def layer24_conv_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 54
    return p

def layer25_norm_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 55
    return p

def layer26_attn_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 56
    return p

def layer27_mlp_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 57
    return p

def layer28_proj_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 58
    return p

def layer29_embed_backward(nbytes):
    p = ctypes.c_void_p()
    check(RT.cudaMalloc(ctypes.byref(p), nbytes))  # SITE 59
    return p


SITES = [
    layer00_conv_forward,
    layer01_norm_forward,
    layer02_attn_forward,
    layer03_mlp_forward,
    layer04_proj_forward,
    layer05_embed_forward,
    layer06_conv_forward,
    layer07_norm_forward,
    layer08_attn_forward,
    layer09_mlp_forward,
    layer10_proj_forward,
    layer11_embed_forward,
    layer12_conv_forward,
    layer13_norm_forward,
    layer14_attn_forward,
    layer15_mlp_forward,
    layer16_proj_forward,
    layer17_embed_forward,
    layer18_conv_forward,
    layer19_norm_forward,
    layer20_attn_forward,
    layer21_mlp_forward,
    layer22_proj_forward,
    layer23_embed_forward,
    layer24_conv_forward,
    layer25_norm_forward,
    layer26_attn_forward,
    layer27_mlp_forward,
    layer28_proj_forward,
    layer29_embed_forward,
    layer00_conv_backward,
    layer01_norm_backward,
    layer02_attn_backward,
    layer03_mlp_backward,
    layer04_proj_backward,
    layer05_embed_backward,
    layer06_conv_backward,
    layer07_norm_backward,
    layer08_attn_backward,
    layer09_mlp_backward,
    layer10_proj_backward,
    layer11_embed_backward,
    layer12_conv_backward,
    layer13_norm_backward,
    layer14_attn_backward,
    layer15_mlp_backward,
    layer16_proj_backward,
    layer17_embed_backward,
    layer18_conv_backward,
    layer19_norm_backward,
    layer20_attn_backward,
    layer21_mlp_backward,
    layer22_proj_backward,
    layer23_embed_backward,
    layer24_conv_backward,
    layer25_norm_backward,
    layer26_attn_backward,
    layer27_mlp_backward,
    layer28_proj_backward,
    layer29_embed_backward,
]


def step(k, held, burst):
    for i in range(0, 20):
        held.append(SITES[i]((20 - i) ** 2 * 1200))
    for i in range(20, 40):
        p = SITES[i]((40 - i) ** 2 * 1024)
        if k % 2:
            sim.free(p)
        else:
            held.append(p)
    if 36 <= k < 48:
        for i in range(40, 50):
            burst[i].extend(SITES[i](MIB) for _ in range(5))
    if k == 48:
        for i in range(40, 50):
            keep = 5 if i < 45 else 4
            for p in burst[i][keep:]:
                sim.free(p)
            held.extend(burst[i][:keep])
    if k >= 30:
        for i in range(50, 60):
            held.extend(SITES[i](512 * KIB) for _ in range(2))


def train():
    held = []
    burst = {i: [] for i in range(40, 50)}
    for k in range(60):
        step(k, held, burst)
        time.sleep(0.02)
    return held


def main():
    held = train()
    print("held %d blocks" % len(held), flush=True)


main()
