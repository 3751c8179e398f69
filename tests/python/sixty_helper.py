"""Sixty call sites that all allocate through one small helper, `raw`, as
real code bases do (a tensor factory, a buffer pool, `torch.empty`): every
stack's innermost Python frame is `raw` at one line, and only the frame
below it tells the sites apart. tests/c/sixty_helper.c is its C twin.

    python3 sixty_helper.py

Site i is the function augment_i (marked "# SITE i"); it leaks one block of
(i + 1) x 64 KiB through raw's one cudaMalloc line ("# HELPER"). Site 59
holds the most (3.75 MiB), site 0 the least; 60 blocks, 1830 x 64 KiB
(114.4 MiB) leaked in all, each site a group of its own.
"""

import ctypes

import sim

RT = sim.RT
UNIT = 64 * 1024
kept = []


def raw(nbytes):
    p = ctypes.c_void_p()
    rc = RT.cudaMalloc(ctypes.byref(p), nbytes)  # HELPER
    assert rc == 0, rc
    return p


def augment_0():
    kept.append(raw(1 * UNIT))  # SITE 0

def augment_1():
    kept.append(raw(2 * UNIT))  # SITE 1

def augment_2():
    kept.append(raw(3 * UNIT))  # SITE 2

def augment_3():
    kept.append(raw(4 * UNIT))  # SITE 3

def augment_4():
    kept.append(raw(5 * UNIT))  # SITE 4

def augment_5():
    kept.append(raw(6 * UNIT))  # SITE 5

def augment_6():
    kept.append(raw(7 * UNIT))  # SITE 6

def augment_7():
    kept.append(raw(8 * UNIT))  # SITE 7

def augment_8():
    kept.append(raw(9 * UNIT))  # SITE 8

def augment_9():
    kept.append(raw(10 * UNIT))  # SITE 9

def augment_10():
    kept.append(raw(11 * UNIT))  # SITE 10

def augment_11():
    kept.append(raw(12 * UNIT))  # SITE 11

def augment_12():
    kept.append(raw(13 * UNIT))  # SITE 12

def augment_13():
    kept.append(raw(14 * UNIT))  # SITE 13

def augment_14():
    kept.append(raw(15 * UNIT))  # SITE 14

def augment_15():
    kept.append(raw(16 * UNIT))  # SITE 15

def augment_16():
    kept.append(raw(17 * UNIT))  # SITE 16

def augment_17():
    kept.append(raw(18 * UNIT))  # SITE 17

def augment_18():
    kept.append(raw(19 * UNIT))  # SITE 18

def augment_19():
    kept.append(raw(20 * UNIT))  # SITE 19

def augment_20():
    kept.append(raw(21 * UNIT))  # SITE 20

def augment_21():
    kept.append(raw(22 * UNIT))  # SITE 21

def augment_22():
    kept.append(raw(23 * UNIT))  # SITE 22

def augment_23():
    kept.append(raw(24 * UNIT))  # SITE 23

def augment_24():
    kept.append(raw(25 * UNIT))  # SITE 24

def augment_25():
    kept.append(raw(26 * UNIT))  # SITE 25

def augment_26():
    kept.append(raw(27 * UNIT))  # SITE 26

def augment_27():
    kept.append(raw(28 * UNIT))  # SITE 27

def augment_28():
    kept.append(raw(29 * UNIT))  # SITE 28

def augment_29():
    kept.append(raw(30 * UNIT))  # SITE 29

def augment_30():
    kept.append(raw(31 * UNIT))  # SITE 30

def augment_31():
    kept.append(raw(32 * UNIT))  # SITE 31

def augment_32():
    kept.append(raw(33 * UNIT))  # SITE 32

def augment_33():
    kept.append(raw(34 * UNIT))  # SITE 33

def augment_34():
    kept.append(raw(35 * UNIT))  # SITE 34

def augment_35():
    kept.append(raw(36 * UNIT))  # SITE 35

def augment_36():
    kept.append(raw(37 * UNIT))  # SITE 36

def augment_37():
    kept.append(raw(38 * UNIT))  # SITE 37

def augment_38():
    kept.append(raw(39 * UNIT))  # SITE 38

def augment_39():
    kept.append(raw(40 * UNIT))  # SITE 39

def augment_40():
    kept.append(raw(41 * UNIT))  # SITE 40

def augment_41():
    kept.append(raw(42 * UNIT))  # SITE 41

def augment_42():
    kept.append(raw(43 * UNIT))  # SITE 42

def augment_43():
    kept.append(raw(44 * UNIT))  # SITE 43

def augment_44():
    kept.append(raw(45 * UNIT))  # SITE 44

def augment_45():
    kept.append(raw(46 * UNIT))  # SITE 45

def augment_46():
    kept.append(raw(47 * UNIT))  # SITE 46

def augment_47():
    kept.append(raw(48 * UNIT))  # SITE 47

def augment_48():
    kept.append(raw(49 * UNIT))  # SITE 48

def augment_49():
    kept.append(raw(50 * UNIT))  # SITE 49

def augment_50():
    kept.append(raw(51 * UNIT))  # SITE 50

def augment_51():
    kept.append(raw(52 * UNIT))  # SITE 51

def augment_52():
    kept.append(raw(53 * UNIT))  # SITE 52

def augment_53():
    kept.append(raw(54 * UNIT))  # SITE 53

def augment_54():
    kept.append(raw(55 * UNIT))  # SITE 54

def augment_55():
    kept.append(raw(56 * UNIT))  # SITE 55

def augment_56():
    kept.append(raw(57 * UNIT))  # SITE 56

def augment_57():
    kept.append(raw(58 * UNIT))  # SITE 57

def augment_58():
    kept.append(raw(59 * UNIT))  # SITE 58

def augment_59():
    kept.append(raw(60 * UNIT))  # SITE 59


for i in range(60):
    globals()["augment_%d" % i]()
