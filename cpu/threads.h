/* cpu/threads.h: the size of the OpenMP team frugal's CPU kernels run with.
 * Internal to cpu/. */
#ifndef FR_CPU_THREADS_H
#define FR_CPU_THREADS_H

/* The number of threads a kernel called here will get: 1 inside a parallel
 * region, else the team size, which the first call fixes for the process
 * (threads.c says how). Kernels that size buffers or work splits per thread
 * call this before their first parallel region. */
int fr_cpu_threads(void);

#endif
