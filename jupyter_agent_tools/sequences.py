"""Order within sequences (pure): which items kept their relative order."""

from __future__ import annotations


def longest_increasing(values: list[int]) -> set[int]:
    """Positions in ``values`` of one longest strictly increasing subsequence."""
    tails: list[int] = []  # position of the smallest tail of an increasing run of each length
    previous: list[int] = [-1] * len(values)
    for i, value in enumerate(values):
        lo, hi = 0, len(tails)
        while lo < hi:
            mid = (lo + hi) // 2
            if values[tails[mid]] < value:
                lo = mid + 1
            else:
                hi = mid
        if lo > 0:
            previous[i] = tails[lo - 1]
        if lo == len(tails):
            tails.append(i)
        else:
            tails[lo] = i
    keep: set[int] = set()
    i = tails[-1] if tails else -1
    while i >= 0:
        keep.add(i)
        i = previous[i]
    return keep
