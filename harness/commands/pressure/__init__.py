"""pressure: a CPU tier smaller than what its workload stores, under LRU or ARC and a
store threshold, with every hit, store and eviction predicted (``oracle``)."""
