# Environment that keeps the memory of long Flower runs flat. Source it: `. scripts/memory-env.sh`.
#
# glibc serves large allocations (a decoded model, a message's arrays) with mmap and returns them
# to the system on free, but it raises that threshold to the size of every mmapped block freed,
# up to 32 MiB: after the first round, tens of MB of arrays per message come from the heap
# instead and stay resident after they are freed. A fixed threshold turns that adjustment off.
# Measured once by hand (summed RSS of every process of a two-round, six-site, 64 px simulation):
# 6047 -> 5523 MiB;
# MALLOC_ARENA_MAX=2 alone changed nothing (6022 MiB). A value already set wins.
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-131072}"
