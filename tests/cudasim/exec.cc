/* cudasim's launcher (sim.h): runs a grid on the calling thread, one block after another,
 * each CUDA thread a fiber with a stack of its own. __syncthreads parks a fiber until every
 * live thread of its block has arrived; a warp operation parks it until the lanes of its mask
 * have arrived, then hands each lane its result. Between two __syncthreads each warp runs as
 * far as it can before the next starts, warps and lanes in thread order, or in reverse order
 * with CUDASIM_SCHEDULE=reverse (the blocks too): a kernel whose result depends on the order
 * has a race (a barrier missing before a read, or before an overwrite). A kernel bug the launcher
 * can see (a barrier in divergent code, a lane exiting while its warp waits for it, a deadlock) is
 * reported with the kernel, the launch site, the block and the thread, and the process aborts.
 * A launch on a deferred stream (CUDASIM_ASYNC=1) is checked at once and runs later, from a
 * copy of its arguments, when the runtime (runtime.cc) runs the stream's queue. */
#include <errno.h>
#include <memory>
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

/* The context switch: hand-written for x86-64 (a few instructions, no system call);
 * ucontext elsewhere, or with -DCUDASIM_UCONTEXT. */
#if defined(__x86_64__) && !defined(CUDASIM_UCONTEXT)
#define FAST_SWITCH 1
#else
#define FAST_SWITCH 0
#include <ucontext.h>
#endif

#include "sim.h"
#include "internal.h"
#include "banned.h"

/* A fiber's stack: kernels keep a few registers' worth of locals, but device printf and libm
 * run on it too. Untouched pages cost nothing (mmap commits lazily). */
#define STACK_SIZE   (256u << 10)
#define PAGE         4096u
#define WARP         32u
/* CUDA's limits (compute capability 9.0): threads per block and per block dimension, grid
 * dimensions, and dynamic shared memory per block with the opt-in (227 KiB). */
#define MAX_THREADS  1024u
#define MAX_BLOCK_Z  64u
#define MAX_GRID_X   2147483647u
#define MAX_GRID_YZ  65535u
#define MAX_DYN_SMEM 232448u
/* Dynamic shared memory alignment: CUDA guarantees at least 16 bytes. */
#define SMEM_ALIGN   16u

/* ---- the index variables ------------------------------------------------------------------- */

static const uint3 no_thread = {0, 0, 0};
const uint3 *cudasim_thread_idx = &no_thread;
uint3 cudasim_block_idx;
dim3 cudasim_block_dim;
dim3 cudasim_grid_dim;

/* ---- fibers -------------------------------------------------------------------------------- */

enum fstate : uint8_t {
    F_READY,      /* runnable: not started, or released from a barrier */
    F_WAIT_BLOCK, /* at __syncthreads */
    F_WAIT_WARP,  /* at a warp operation */
    F_DONE,
};

struct fiber {
#if FAST_SWITCH
    void *sp; /* saved stack pointer while switched out */
#else
    ucontext_t uc;
#endif
    char *stack; /* lowest usable byte of its stack; NULL until it first runs */
    uint3 tid;
    unsigned index, warp, lane;
    fstate state;
    /* The pending operation: a warp op's kind, mask, value, argument and width, or a block
     * barrier's kind and predicate (in value); result is what the operation returns. */
    int op, arg, width;
    unsigned mask;
    uint64_t value, result;
};

/* Block barrier kinds: plain, count, and, or (the block must agree). */
enum { BAR_SYNC, BAR_COUNT, BAR_AND, BAR_OR };
static const char *const bar_names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                        "__syncthreads_or"};
static const char *const warp_names[] = {"__syncwarp",       "__shfl_sync",     "__shfl_up_sync",
                                         "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
                                         "__all_sync",       "__any_sync"};

/* The launch being run (NULL between launches). */
struct launch {
    const cudasim_site *site;
    dim3 grid, block;
    size_t smem;
    char *dyn;
    void (*body)(void *);
    void *arg;
    bool reverse;
};

static std::mutex launch_mu;
static launch *L;
static fiber *cur; /* the running fiber, NULL on the scheduler */
static std::vector<fiber> fibers;
static unsigned n_threads, live, waiting, exited, first_exited, bar_kind;
/* Where the threads waiting at the block barrier called it from (one source line for all). */
static const char *bar_file;
static int bar_line;
static unsigned bar_first;
/* Per warp: lanes waiting at a warp operation, and lanes that have exited (a bit each). */
static unsigned warp_waiting[MAX_THREADS / WARP], warp_exited[MAX_THREADS / WARP];
/* The schedule. A phase runs from one __syncthreads to the next: its fibers in run_q (from
 * run_pos on), in thread order or reverse. A warp whose lanes meet at a warp operation goes on
 * at once (hot, from hot_pos on, ahead of run_q), so that each warp runs as far as it can, up
 * to the block barrier, before the next warp starts: a warp reading what another has not
 * written yet, or overwriting what another has not read yet, shows in one of the two orders.
 * Fibers released by the block barrier form the next phase (next_q). */
static std::vector<unsigned> run_q, next_q, hot;
static size_t run_pos, hot_pos;
static bool reverse_order;
/* The stack of a fiber that just finished: back to the pool once we are off it. */
static char *dead_stack;

#if FAST_SWITCH
static void *sched_sp;
/* Saves the callee-saved registers on the current stack, stores the stack pointer in *save,
 * switches to the stack `to` and restores the registers saved there (SysV x86-64 ABI). */
extern "C" void cudasim_switch(void **save, void *to);
asm(".text\n"
    ".globl cudasim_switch\n"
    ".hidden cudasim_switch\n"
    ".type cudasim_switch,@function\n"
    "cudasim_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size cudasim_switch, .-cudasim_switch\n");
#else
static ucontext_t sched_uc;
#endif

/* Stacks are kept for the process's life and reused: one serves every thread of a kernel
 * without barriers, one per thread parked at a barrier otherwise. */
static std::vector<char *> free_stacks, all_stacks;

[[noreturn]] static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fputs("cudasim: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

static int where(char *buf, size_t len, const fiber *f)
{
    const launch *l = L;
    if (!l)
        return snprintf(buf, len, "(no kernel running)");
    int n = snprintf(buf, len, "kernel '%s' launched at %s:%d, block (%u,%u,%u)", l->site->kernel,
                     l->site->file, l->site->line, cudasim_block_idx.x, cudasim_block_idx.y,
                     cudasim_block_idx.z);
    if (f && n >= 0 && (size_t)n < len)
        n +=
            snprintf(buf + n, len - (size_t)n, ", thread (%u,%u,%u)", f->tid.x, f->tid.y, f->tid.z);
    return n;
}

/* A bug of the running kernel: says where and aborts. */
[[noreturn]] static void fail(const fiber *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fail(const fiber *f, const char *fmt, ...)
{
    char at[512], msg[1024];
    va_list ap;
    where(at, sizeof(at), f);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    die("%s: %s", at, msg);
}

static char *stack_get(void)
{
    if (!free_stacks.empty()) {
        char *s = free_stacks.back();
        free_stacks.pop_back();
        return s;
    }
    /* A guard page below the stack turns an overflow into a fault the handler names. */
    char *m = (char *)mmap(NULL, STACK_SIZE + PAGE, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
        die("cannot map a %u KiB fiber stack: %s", STACK_SIZE >> 10, strerror(errno));
    if (mprotect(m, PAGE, PROT_NONE) < 0)
        die("cannot protect a fiber stack's guard page: %s", strerror(errno));
    all_stacks.push_back(m + PAGE);
    return m + PAGE;
}

static void thread_exit(fiber *f);
static void leave(fiber *f);

/* After every switch: the stack of a fiber that finished is free now that nobody runs on it. */
static void after_switch(void)
{
    if (dead_stack) {
        free_stacks.push_back(dead_stack);
        dead_stack = NULL;
    }
}

/* The first frame of every fiber: the kernel's body, then the exit checks; never returns. */
static void fiber_entry(void)
{
    after_switch();
    fiber *f = cur;
    L->body(L->arg);
    thread_exit(f);
    dead_stack = f->stack;
    f->stack = NULL;
    leave(f);
    die("a finished fiber was resumed");
}

/* Makes f the running fiber, with a fresh stack frame if it has not started. */
static void enter(fiber *f)
{
    cur = f;
    cudasim_thread_idx = &f->tid;
    if (f->stack)
        return;
    f->stack = stack_get();
#if FAST_SWITCH
    /* A frame for cudasim_switch to pop: six zero registers, fiber_entry as the return
     * address, and a null slot above it so that fiber_entry starts with the stack aligned as
     * after a call. */
    void **sp = (void **)(f->stack + STACK_SIZE);
    *--sp = NULL;
    *--sp = (void *)fiber_entry;
    for (int i = 0; i < 6; i++)
        *--sp = NULL;
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK_SIZE;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, fiber_entry, 0);
#endif
}

/* Switches from f (parked or finished) straight to the phase's next fiber, or to the scheduler
 * when the phase is over; returns when f is resumed. */
static void leave(fiber *f)
{
    fiber *n = NULL;
    if (hot_pos < hot.size()) {
        n = &fibers[hot[hot_pos++]];
        if (hot_pos == hot.size())
            hot.clear(), hot_pos = 0;
    } else if (run_pos < run_q.size()) {
        n = &fibers[run_q[run_pos++]];
    }
    if (n)
        enter(n);
    else
        cur = NULL;
#if FAST_SWITCH
    cudasim_switch(&f->sp, n ? n->sp : sched_sp);
#else
    swapcontext(&f->uc, n ? &n->uc : &sched_uc);
#endif
    after_switch();
}

/* Queues g: next in this phase (a warp operation's group), or for the next phase (the block
 * barrier). */
static void release(fiber *g, bool now)
{
    g->state = F_READY;
    (now ? hot : next_q).push_back(g->index);
}

/* Parks f until a barrier releases it. */
static void park(fiber *f)
{
    leave(f);
}

static fiber *need_fiber(const char *what)
{
    if (!cur)
        die("%s called outside a kernel", what);
    return cur;
}

/* ---- block barriers ------------------------------------------------------------------------ */

static void release_block(void)
{
    unsigned count = 0;
    for (unsigned i = 0; i < n_threads; i++)
        if (fibers[i].state == F_WAIT_BLOCK)
            count += fibers[i].value != 0;
    for (unsigned k = 0; k < n_threads; k++) {
        fiber *g = &fibers[reverse_order ? n_threads - 1 - k : k];
        if (g->state != F_WAIT_BLOCK)
            continue;
        g->result = bar_kind == BAR_COUNT ? count
                    : bar_kind == BAR_AND ? count == waiting
                    : bar_kind == BAR_OR  ? count > 0
                                          : 0;
        release(g, false);
    }
    waiting = 0;
}

/* file, line: the call's source line. Threads meeting at __syncthreads from two different
 * lines (the two branches of an if) are in divergent code, which a GPU may hang on. */
static int block_barrier(int kind, int pred, const char *file, int line)
{
    fiber *f = need_fiber(bar_names[kind]);
    if (exited)
        fail(f,
             "%s reached after thread (%u,%u,%u) of the block exited (a barrier in divergent "
             "code: every thread of the block must reach it)",
             bar_names[kind], fibers[first_exited].tid.x, fibers[first_exited].tid.y,
             fibers[first_exited].tid.z);
    if (waiting == 0) {
        bar_kind = (unsigned)kind;
        bar_file = file;
        bar_line = line;
        bar_first = f->index;
    } else if (bar_kind != (unsigned)kind || bar_line != line ||
               (bar_file != file && strcmp(bar_file, file))) {
        const fiber *g = &fibers[bar_first];
        fail(f,
             "%s at %s:%d reached while thread (%u,%u,%u) waits at %s at %s:%d (a barrier in "
             "divergent code: every thread of the block must reach the same one)",
             bar_names[kind], file, line, g->tid.x, g->tid.y, g->tid.z, bar_names[bar_kind],
             bar_file, bar_line);
    }
    f->state = F_WAIT_BLOCK;
    f->value = pred != 0;
    waiting++;
    if (waiting == live)
        release_block();
    park(f);
    return (int)f->result;
}

void cudasim_syncthreads(const char *file, int line)
{
    block_barrier(BAR_SYNC, 0, file, line);
}

int cudasim_syncthreads_count(int pred, const char *file, int line)
{
    return block_barrier(BAR_COUNT, pred, file, line);
}

int cudasim_syncthreads_and(int pred, const char *file, int line)
{
    return block_barrier(BAR_AND, pred, file, line);
}

int cudasim_syncthreads_or(int pred, const char *file, int line)
{
    return block_barrier(BAR_OR, pred, file, line);
}

void __threadfence(void)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void __threadfence_block(void)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void __threadfence_system(void)
{
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void *cudasim_dyn_smem(void)
{
    need_fiber("dynamic shared memory");
    return L->dyn;
}

/* ---- warp operations ----------------------------------------------------------------------- */

/* The number of lanes in mask (without the popcnt instruction, which is not baseline x86-64). */
static inline unsigned lanes_in(unsigned mask)
{
    if (mask == 0xffffffffu)
        return WARP;
    mask = mask - ((mask >> 1) & 0x55555555u);
    mask = (mask & 0x33333333u) + ((mask >> 2) & 0x33333333u);
    return (((mask + (mask >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24;
}

/* The lanes warp w has (a block whose size is not a multiple of 32 has a short last warp). */
static unsigned warp_lanes(unsigned w)
{
    unsigned n = n_threads - w * WARP;
    return n >= WARP ? 0xffffffffu : (1u << n) - 1;
}

/* The lane whose value lane l receives from a shuffle. */
static unsigned shfl_source(const fiber *g, unsigned l)
{
    unsigned w = (unsigned)g->width, seg = l & ~(w - 1), a = (unsigned)g->arg, s = l;
    switch (g->op) {
    case CUDASIM_WARP_SHFL:
        s = seg | (a & (w - 1));
        break;
    case CUDASIM_WARP_SHFL_UP:
        s = (l - seg) >= a ? l - a : l;
        break;
    case CUDASIM_WARP_SHFL_DOWN:
        s = (l - seg) + a < w ? l + a : l;
        break;
    case CUDASIM_WARP_SHFL_XOR:
        /* A lane of a later segment, or past the warp, leaves the caller its own value. */
        s = l ^ a;
        if (s >= WARP || (s & ~(w - 1)) > seg)
            s = l;
        break;
    }
    return s;
}

/* Releases f's group when every lane of its mask has arrived with the same operation. Called
 * when at least as many lanes of the warp wait as the mask names. */
static void warp_try_release(fiber *f)
{
    fiber *w = &fibers[f->warp * WARP];
    unsigned mask = f->mask;

    for (unsigned l = 0; l < WARP; l++) {
        if (!(mask >> l & 1))
            continue;
        const fiber *g = &w[l];
        if (g->state != F_WAIT_WARP)
            return;
        if (g->mask != mask || g->op != f->op || g->width != f->width)
            fail(f,
                 "%s with mask 0x%08x (width %d) while lane %u waits at %s with mask 0x%08x "
                 "(width %d): the lanes of a mask must meet at the same operation",
                 warp_names[f->op], mask, f->width, l, warp_names[g->op], g->mask, g->width);
    }
    uint64_t votes = 0;
    unsigned n_true = 0, n = 0;
    for (unsigned l = 0; l < WARP; l++)
        if (mask >> l & 1) {
            n++;
            if (w[l].value) {
                votes |= 1ull << l;
                n_true++;
            }
        }
    for (unsigned l = 0; l < WARP; l++) {
        if (!(mask >> l & 1))
            continue;
        fiber *g = &w[l];
        switch (g->op) {
        case CUDASIM_WARP_SYNC:
            g->result = 0;
            break;
        case CUDASIM_WARP_BALLOT:
            g->result = votes;
            break;
        case CUDASIM_WARP_ALL:
            g->result = n_true == n;
            break;
        case CUDASIM_WARP_ANY:
            g->result = n_true > 0;
            break;
        default: {
            unsigned s = shfl_source(g, l);
            if (!(mask >> s & 1))
                fail(g,
                     "%s with mask 0x%08x: lane %u reads lane %u, which is not in the mask (its "
                     "value is undefined)",
                     warp_names[g->op], mask, l, s);
            g->result = w[s].value;
            break;
        }
        }
    }
    for (unsigned k = 0; k < WARP; k++) {
        unsigned l = reverse_order ? WARP - 1 - k : k;
        if (mask >> l & 1)
            release(&w[l], true);
    }
    warp_waiting[f->warp] -= lanes_in(mask);
}

uint64_t cudasim_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width)
{
    fiber *f = need_fiber(kind >= 0 && kind <= CUDASIM_WARP_ANY ? warp_names[kind] : "a warp op");
    unsigned have = warp_lanes(f->warp);

    if (width <= 0 || width > (int)WARP || (width & (width - 1)))
        fail(f, "%s: width %d is not a power of two in [1, 32]", warp_names[kind], width);
    if (!(mask >> f->lane & 1))
        fail(f, "%s: lane %u passes mask 0x%08x, which leaves the lane itself out",
             warp_names[kind], f->lane, mask);
    if (mask & ~have)
        fail(f,
             "%s: mask 0x%08x names lanes that warp %u does not have (its lanes: 0x%08x; the "
             "block has %u threads)",
             warp_names[kind], mask, f->warp, have, n_threads);
    if (mask & warp_exited[f->warp])
        fail(f, "%s with mask 0x%08x: lane %d has exited (a mask must name live lanes only)",
             warp_names[kind], mask, __builtin_ctz(mask & warp_exited[f->warp]));
    f->op = kind;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
    f->state = F_WAIT_WARP;
    if (++warp_waiting[f->warp] >= lanes_in(mask))
        warp_try_release(f);
    park(f);
    return f->result;
}

unsigned __activemask(void)
{
    fiber *f = need_fiber("__activemask");
    unsigned m = 0, have = warp_lanes(f->warp);
    for (unsigned l = 0; l < WARP; l++)
        if ((have >> l & 1) && fibers[f->warp * WARP + l].state != F_DONE)
            m |= 1u << l;
    return m;
}

/* ---- threads and blocks -------------------------------------------------------------------- */

static void thread_exit(fiber *f)
{
    f->state = F_DONE;
    live--;
    if (!exited++)
        first_exited = f->index;
    if (waiting)
        fail(f,
             "the thread exited while %u thread(s) of its block wait at %s (a barrier in "
             "divergent code: every thread of the block must reach it)",
             waiting, bar_names[bar_kind]);
    warp_exited[f->warp] |= 1u << f->lane;
    if (!warp_waiting[f->warp])
        return;
    const fiber *w = &fibers[f->warp * WARP];
    for (unsigned l = 0; l < WARP && f->warp * WARP + l < n_threads; l++)
        if (w[l].state == F_WAIT_WARP && (w[l].mask >> f->lane & 1))
            fail(f, "the thread (lane %u) exited while lane %u waits for it at %s with mask 0x%08x",
                 f->lane, l, warp_names[w[l].op], w[l].mask);
}

[[noreturn]] static void deadlock(void)
{
    char detail[1024];
    int n = 0;
    unsigned at_warp = 0;
    for (unsigned i = 0; i < n_threads; i++)
        at_warp += fibers[i].state == F_WAIT_WARP;
    n += snprintf(detail + n, sizeof(detail) - (size_t)n,
                  "deadlock: %u thread(s) wait at %s, %u at warp operations, %u exited", waiting,
                  waiting ? bar_names[bar_kind] : "__syncthreads", at_warp, exited);
    for (unsigned i = 0; i < n_threads && n < (int)sizeof(detail) - 100; i++) {
        const fiber *g = &fibers[i];
        if (g->state == F_WAIT_WARP &&
            (i % WARP == 0 || fibers[i - 1].state != F_WAIT_WARP || fibers[i - 1].mask != g->mask))
            n += snprintf(detail + n, sizeof(detail) - (size_t)n,
                          "; warp %u lane %u waits at %s with mask 0x%08x", g->warp, g->lane,
                          warp_names[g->op], g->mask);
    }
    fail(NULL, "%s", detail);
}

static void run_block(const launch *l)
{
    /* Shared memory starts as garbage on a GPU: here every block starts with 0xff (NaN). */
    extern char __start_cudasim_shared[] __attribute__((weak));
    extern char __stop_cudasim_shared[] __attribute__((weak));
    char *start = __start_cudasim_shared, *stop = __stop_cudasim_shared;
    if (start && stop > start)
        memset(start, 0xff, (size_t)(stop - start));
    if (l->smem)
        memset(l->dyn, 0xff, l->smem);

    unsigned bx = l->block.x, bxy = l->block.x * l->block.y;
    for (unsigned i = 0; i < n_threads; i++) {
        fiber *f = &fibers[i];
        f->stack = NULL;
        f->tid = {i % bx, i % bxy / bx, i / bxy};
        f->index = i;
        f->warp = i / WARP;
        f->lane = i % WARP;
        f->state = F_READY;
        f->mask = 0;
    }
    live = n_threads;
    waiting = exited = 0;
    memset(warp_waiting, 0, sizeof(warp_waiting));
    memset(warp_exited, 0, sizeof(warp_exited));
    reverse_order = l->reverse;
    run_q.resize(n_threads);
    for (unsigned k = 0; k < n_threads; k++)
        run_q[k] = l->reverse ? n_threads - 1 - k : k;
    next_q.clear();
    hot.clear();
    hot_pos = 0;
    /* One phase per turn: its fibers run one after the other (each hands over to the next as
     * it parks or finishes), those the block barrier releases form the next phase. */
    while (live) {
        if (run_q.empty())
            deadlock();
        run_pos = 1;
        fiber *f = &fibers[run_q[0]];
        enter(f);
#if FAST_SWITCH
        cudasim_switch(&sched_sp, f->sp);
#else
        swapcontext(&sched_uc, &f->uc);
#endif
        after_switch();
        std::swap(run_q, next_q);
        next_q.clear();
    }
    cudasim_thread_idx = &no_thread;
}

/* The dynamic shared memory of a launch of smem bytes: its end abuts a guard page. The mapping
 * is made once, for the largest size a launch may ask for. */
static char *dyn_region(size_t smem)
{
    static char *guard;
    if (!guard) {
        size_t size = (MAX_DYN_SMEM + PAGE - 1) / PAGE * PAGE;
        char *m = (char *)mmap(NULL, size + PAGE, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            die("cannot map the dynamic shared memory: %s", strerror(errno));
        if (mprotect(m + size, PAGE, PROT_NONE) < 0)
            die("cannot protect the dynamic shared memory's guard page: %s", strerror(errno));
        guard = m + size;
    }
    return guard - (smem + SMEM_ALIGN - 1) / SMEM_ALIGN * SMEM_ALIGN;
}

static bool schedule_reverse(void)
{
    const char *s = getenv("CUDASIM_SCHEDULE");
    if (!s || !*s || !strcmp(s, "forward"))
        return false;
    if (!strcmp(s, "reverse"))
        return true;
    die("CUDASIM_SCHEDULE is '%s': it must be 'forward' or 'reverse'", s);
}

static bool bad_dims(dim3 grid, dim3 block)
{
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    return !grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z ||
           grid.x > MAX_GRID_X || grid.y > MAX_GRID_YZ || grid.z > MAX_GRID_YZ ||
           block.x > MAX_THREADS || block.y > MAX_THREADS || block.z > MAX_BLOCK_Z ||
           threads > MAX_THREADS;
}

/* Runs the grid of a launch that passed cudasim_run's checks. */
static void execute(const cudasim_site &site, const cudasim_config &cfg, void (*body)(void *),
                    void *arg)
{
    std::lock_guard<std::mutex> lock(launch_mu);
    cudasim_fault_setup();
    launch l = {&site, cfg.grid, cfg.block,         cfg.smem, dyn_region(cfg.smem),
                body,  arg,      schedule_reverse()};
    if (getenv("CUDASIM_TRACE"))
        fprintf(stderr, "cudasim: %s at %s:%d grid (%u,%u,%u) block (%u,%u,%u) smem %zu%s\n",
                site.kernel, site.file, site.line, cfg.grid.x, cfg.grid.y, cfg.grid.z, cfg.block.x,
                cfg.block.y, cfg.block.z, cfg.smem, l.reverse ? " reverse" : "");
    n_threads = cfg.block.x * cfg.block.y * cfg.block.z;
    if (fibers.size() < n_threads)
        fibers.resize(n_threads);
    cudasim_grid_dim = cfg.grid;
    cudasim_block_dim = cfg.block;
    L = &l;
    unsigned long long gx = cfg.grid.x, gxy = gx * cfg.grid.y, blocks = gxy * cfg.grid.z;
    for (unsigned long long k = 0; k < blocks; k++) {
        unsigned long long b = l.reverse ? blocks - 1 - k : k;
        cudasim_block_idx = {(unsigned)(b % gx), (unsigned)(b % gxy / gx), (unsigned)(b / gxy)};
        run_block(&l);
    }
    L = NULL;
    cudasim_block_idx = {0, 0, 0};
    char after[512];
    snprintf(after, sizeof(after), "kernel '%s' launched at %s:%d", site.kernel, site.file,
             site.line);
    cudasim_check_canaries(after);
}

void cudasim_run(const cudasim_site &site, const cudasim_config &cfg, const void *fn,
                 void (*body)(void *), void *arg, void *(*clone)(const void *),
                 void (*drop)(void *), const void *const *ptrs, int n_ptrs)
{
    cudaError_t e;

    if (cur)
        fail(cur, "kernel '%s' launched from device code (dynamic parallelism is not simulated)",
             site.kernel);
    if ((e = cudasim_device_check()) != cudaSuccess) {
        cudasim_record(e);
        return;
    }
    if (bad_dims(cfg.grid, cfg.block)) {
        cudasim_record(cudaErrorInvalidConfiguration);
        return;
    }
    if (!cudasim_stream_valid(cfg.stream)) {
        cudasim_record(cudaErrorInvalidResourceHandle);
        return;
    }
    if (cfg.smem > cudasim_func_dyn_smem_limit(fn)) {
        cudasim_record(cudaErrorInvalidValue);
        return;
    }
    for (int i = 0; i < n_ptrs; i++) {
        char why[256];
        if (ptrs[i] && !cudasim_ptr_valid(ptrs[i], why, sizeof(why)))
            die("kernel '%s' launched at %s:%d: argument %d (%p) is not device memory (%s): the "
                "GPU would fault on it",
                site.kernel, site.file, site.line, i + 1, ptrs[i], why);
    }

    if (!cudasim_stream_deferred(cfg.stream)) {
        cudasim_stream_submit(cfg.stream, [&] { execute(site, cfg, body, arg); });
        return;
    }
    /* Deferred (or captured into a graph, and then run as often as the graph is launched):
     * the launch keeps copies of its site, configuration and arguments (by value, as CUDA
     * captures them at the launch). */
    std::shared_ptr<void> copy(clone(arg), drop);
    cudasim_site s = site;
    cudasim_config c = cfg;
    cudasim_stream_submit(cfg.stream, [s, c, body, copy] { execute(s, c, body, copy.get()); });
}

/* ---- the fault handler's questions --------------------------------------------------------- */

bool cudasim_exec_where(char *buf, size_t len)
{
    if (!L)
        return false;
    where(buf, len, cur);
    return true;
}

bool cudasim_exec_fault_what(uintptr_t addr, char *buf, size_t len)
{
    for (char *s : all_stacks)
        if (addr >= (uintptr_t)s - PAGE && addr < (uintptr_t)s) {
            snprintf(buf, len,
                     "a fiber's stack overflowed (%u KiB: deep recursion or a large "
                     "local array in the kernel)",
                     STACK_SIZE >> 10);
            return true;
        }
    if (L && addr >= (uintptr_t)L->dyn + L->smem && addr < (uintptr_t)L->dyn + L->smem + PAGE) {
        snprintf(buf, len,
                 "%zu bytes past the end of the launch's %zu bytes of dynamic shared memory",
                 (size_t)(addr - ((uintptr_t)L->dyn + L->smem)), L->smem);
        return true;
    }
    return false;
}
