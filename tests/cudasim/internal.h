/* What cudasim's own files share (exec.cc, runtime.cc): the runtime's error state, device and
 * stream checks and allocation table as the launcher needs them, and the launcher's state as
 * the fault handler reports it. Not for kernels or callers. */
#ifndef GPURUN_CUDASIM_INTERNAL_H
#define GPURUN_CUDASIM_INTERNAL_H

#include <cuda_runtime_api.h>
#include <functional>
#include <stddef.h>
#include <stdint.h>

struct cudasim_site;

/* ---- runtime.cc -------------------------------------------------------------------------- */

/* Records e as the calling thread's last error (what cudaGetLastError returns) and returns
 * it; cudaSuccess records nothing. */
cudaError_t cudasim_record(cudaError_t e);
/* cudaSuccess when the process sees a device (CUDASIM_DEVICES, CUDA_VISIBLE_DEVICES), else
 * cudaErrorNoDevice. */
cudaError_t cudasim_device_check(void);
/* Whether s is 0, a special stream handle or a live stream of cudaStreamCreate*. */
bool cudasim_stream_valid(cudaStream_t s);
/* Whether work queued on s waits in its queue (CUDASIM_ASYNC=1 and s a live stream of
 * cudaStreamCreate*) rather than running inside the call that queues it. */
bool cudasim_stream_deferred(cudaStream_t s);
/* Queues fn (new: the queue owns it) on s: on a deferred stream it runs when CUDA's rules
 * force the stream's work to (a synchronisation...); on another stream it runs now, after the
 * blocking streams' work for the legacy default stream. fn must not call back into the
 * runtime's stream or event functions from another thread. */
void cudasim_stream_submit(cudaStream_t s, std::function<void()> fn);
/* Called by queued work that fails in a way that never completes on a GPU (an NCCL collective
 * whose peer is gone: its kernel waits until the communicator is aborted): the stream running
 * it stays at it, cudaStreamQuery answers cudaErrorNotReady, and a host wait for it aborts
 * with a message naming what (it would hang), until cudasim_stream_release(owner). */
void cudasim_stream_hang(const void *owner, const char *what);
/* Lets the streams that owner's work hung go on (the communicator was aborted). */
void cudasim_stream_release(const void *owner);
/* Runs every stream's queued work (a device synchronisation); nothing in synchronous mode. */
void cudasim_drain_all(void);
/* The dynamic shared memory a launch of fn may ask for (48 KiB unless cudaFuncSetAttribute
 * raised it). */
size_t cudasim_func_dyn_smem_limit(const void *fn);
/* Whether p lies in a live allocation of cudaMalloc or cudaMallocHost, its end included.
 * Otherwise why not, into why (len bytes): a freed allocation or no allocation at all. */
bool cudasim_ptr_valid(const void *p, char *why, size_t len);
/* Checks the bytes between each live allocation's end and its guard page, which only an
 * overrun can change; on one, prints which allocation and what ran (after) and aborts. */
void cudasim_check_canaries(const char *after);
/* Installs the fault handler that names the allocation, stack or shared memory a bad access
 * hit, with an alternate signal stack for the calling thread (once per thread). */
void cudasim_fault_setup(void);

/* ---- exec.cc ----------------------------------------------------------------------------- */

/* The running kernel and thread, "kernel 'k' launched at file:line, block (x,y,z), thread
 * (x,y,z)", into buf (len bytes); false outside a kernel. Async-signal-tolerant (no locks,
 * no allocation). */
bool cudasim_exec_where(char *buf, size_t len);
/* What addr is, when it belongs to the launcher (a fiber stack's guard page, past the end of
 * the dynamic shared memory), into buf; false otherwise. Async-signal-tolerant. */
bool cudasim_exec_fault_what(uintptr_t addr, char *buf, size_t len);

#endif
