"""KV memory managers and the allocators under them.

`paged` is vLLM v0's block space manager (block tables, reference counts, copy-on-write, swap);
`prefix_cache` adds automatic prefix caching to it; `reservation` reserves one contiguous extent
per request (Orca, static batching) in an address space from `address_space` (buddy, first-fit);
`blocks` is the free-list block allocator they share. The managers implement
`blocksim.interfaces.MemoryManager`, the contract the scheduler and the engine call.
"""
