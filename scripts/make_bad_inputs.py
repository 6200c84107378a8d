"""Writes the hostile inputs of fixtures/bad/ that need Python's pickler (issue 16). Each is
small on disk and large once its shared objects are copied: gpumem must refuse it early.

Usage: python3 scripts/make_bad_inputs.py     (writes into fixtures/bad/)
"""
import os
import pickle

HERE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "bad")
MIB = 1 << 20


def block(addr, size):
    return {"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": []}


def main():
    base = 0x7F0000000000
    # one segment dict referenced 200,000 times (the pickle memoizes it: written once)
    seg = {"device": 0, "address": base, "total_size": 64 * MIB, "stream": 0, "segment_type": "large",
           "allocated_size": 64 * MIB, "active_size": 64 * MIB, "requested_size": 64 * MIB,
           "blocks": [block(base + i * MIB, MIB) for i in range(64)]}
    with open(os.path.join(HERE, "shared_segment_200k.pickle"), "wb") as f:
        pickle.dump({"segments": [seg] * 200_000, "device_traces": [[]]}, f, protocol=4)
    # one block dict referenced 200,000 times in one segment's list
    b = block(base, MIB)
    seg2 = dict(seg, blocks=[b] * 200_000)
    with open(os.path.join(HERE, "shared_block_200k.pickle"), "wb") as f:
        pickle.dump({"segments": [seg2], "device_traces": [[]]}, f, protocol=4)


if __name__ == "__main__":
    main()
