// A parallel-for for the CPU reference and the host-side packing: dynamic scheduling over an index
// range; the first exception a worker throws is rethrown on the caller's thread.
#pragma once

#include <cstddef>
#include <functional>

namespace mxmoe {

// MXMOE_THREADS if set to a positive number, else the hardware's thread count.
int default_thread_count();

// Calls body(i) for every i in [0, count). `threads` <= 0 means default_thread_count().
void parallel_for(size_t count, int threads, const std::function<void(size_t)>& body);

}  // namespace mxmoe
