/* The shared-memory links of the tcp backend's ring (coll_tcp.h): between two ranks of one
 * machine, a byte ring in a file of /dev/shm that both ends map, with only wake-ups over the
 * link's TCP connection, so that the link's data takes no kernel copies. Made during the
 * ring's handshake (coll_tcp.c); then the ring engine moves each collective's spans through
 * it in pieces. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll_tcp.h"
#include "monotime.h"
#include "banned.h"

/* The data of a shared-memory link: a byte ring, so that a sender runs ahead of its receiver
 * by a few pieces. 1 MiB where every CPU of the machine shares one last-level cache, 4 MiB
 * where they do not: with 4 ranks on this VM's 2 CPUs, 1 MiB rings measured 4.9-5.3 GB/s at
 * 64-256 MiB against 3.3-3.5 for 4 MiB while the two CPUs shared a cache, but 1.0 against
 * 1.9 while the host had put them apart (bench/handoff near 340 ns), as cores on different
 * dies of one server are. Multiples of 64. */
#define SHM_RING_NEAR_BYTES        (1024 * 1024)
#define SHM_RING_FAR_BYTES         (4 * 1024 * 1024)
/* The most a side moves through a shared ring at once before it publishes the move: the
 * receiver starts adding a piece while the sender copies the next. 64 KiB measured up to 1.3x
 * faster than whole spans at 4 MiB, and as fast as 32 KiB and 256 KiB. */
#define SHM_PIECE_BYTES            (64 * 1024)
/* Every operation's stream on a shared-memory link is padded to this, so that the next one
 * starts aligned for elements of every type. */
#define SHM_PAD                    64
/* How long a side looks at a shared ring before it sleeps until a doorbell. A piece takes
 * 2-5 us to copy and a wake-up from poll() 10-50 us on a VM: without a look first, two ranks
 * that fall into step each sleep for every piece, and the same run measured anywhere from 1.4
 * to 5.1 GB/s at 64 MiB (bench/allreduce.sh), with ten times the context switches in the slow
 * runs. */
#define SHM_SPIN_US                200
/* The same look where the machine's ranks outnumber its CPUs, giving the CPU away at every
 * turn: longer, since the rank waited for may get the CPU from it meanwhile. With 4 ranks on
 * 2 CPUs, best of 4 runs against SHM_SPIN_US: 6.2 against 5.8 GB/s at 1 MiB, 4.0 against 3.7
 * at 4 MiB, 3.2 against 3.0 at 16 MiB. */
#define SHM_SPIN_OVERSUBSCRIBED_US 2000

/* The shared part of a shared-memory link, mapped by both ends; the data follows at
 * SHM_DATA_OFF. head counts the bytes the sender has written since the link was made, tail the
 * bytes the receiver has taken; each side waiting for the other raises its flag before it
 * sleeps in poll(), and the other side, after moving head or tail, lowers it and writes one
 * byte (a doorbell) on the link's TCP connection. All accesses are sequentially consistent, so
 * that a side either sees the other's progress or its flag: no wake-up is lost. */
struct coll_shm_ring {
    unsigned char cookie[TOKEN_BYTES];
    /* The data's size, set by the creator before anyone else maps the file. */
    uint64_t bytes;
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint32_t recv_waiting;
    _Alignas(64) _Atomic uint32_t send_waiting;
};
#define SHM_DATA_OFF 4096

/* --- set-up ---------------------------------------------------------------------------------- */

/* The kernel's boot_id. */
void coll_shm_machine(unsigned char *boot_id)
{
    const char *env = getenv("GPURUN_COLL_SHM");
    int fd;

    memset(boot_id, 0, BOOT_ID_BYTES);
    if (env && !strcmp(env, "0"))
        return;
    fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (read(fd, boot_id, BOOT_ID_BYTES) != BOOT_ID_BYTES)
        memset(boot_id, 0, BOOT_ID_BYTES);
    close(fd);
}

bool coll_shm_same_machine(const unsigned char *a, const unsigned char *b)
{
    static const unsigned char zero[BOOT_ID_BYTES];

    return memcmp(a, zero, BOOT_ID_BYTES) && !memcmp(a, b, BOOT_ID_BYTES);
}

/* The first line of a sysfs CPU list ("0-3,8-11") as a set (size bytes); false when the
 * file cannot be read or holds no CPU. */
static bool read_cpulist(const char *path, cpu_set_t *set, size_t size)
{
    char text[4096];
    FILE *f = fopen(path, "re");
    bool any = false;

    CPU_ZERO_S(size, set);
    if (!f)
        return false;
    if (!fgets(text, sizeof(text), f))
        text[0] = '\0';
    fclose(f);
    for (const char *p = text; *p >= '0' && *p <= '9';) {
        char *end;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;

        if (*end == '-')
            hi = strtoul(end + 1, &end, 10);
        for (unsigned long c = lo; c <= hi && c < size * 8; c++, any = true)
            CPU_SET_S(c, size, set);
        p = *end == ',' ? end + 1 : end;
    }
    return any;
}

/* The size of the rings this process makes (SHM_RING_NEAR_BYTES or SHM_RING_FAR_BYTES): near
 * when CPU 0's last-level cache (sysfs's cache/index3) is shared by every online CPU, so that
 * any two ranks share it wherever the scheduler puts them. Read once. */
static uint64_t ring_bytes(void)
{
    static uint64_t bytes;
    int n = CPU_SETSIZE * 4;
    size_t size = CPU_ALLOC_SIZE(n);
    cpu_set_t *online = CPU_ALLOC(n), *shared = CPU_ALLOC(n);

    if (!bytes) {
        bytes = SHM_RING_FAR_BYTES;
        if (online && shared && read_cpulist("/sys/devices/system/cpu/online", online, size) &&
            read_cpulist("/sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list", shared,
                         size)) {
            CPU_AND_S(size, shared, shared, online);
            if (CPU_EQUAL_S(size, shared, online))
                bytes = SHM_RING_NEAR_BYTES;
        }
    }
    CPU_FREE(online);
    CPU_FREE(shared);
    return bytes;
}

int coll_shm_create(char *name, unsigned char *cookie, struct coll_shm_ring **out)
{
    unsigned char rnd[TOKEN_BYTES];
    char *p = name + snprintf(name, SHM_NAME_BYTES, "/gpurun-coll-");
    uint64_t bytes = ring_bytes();
    void *map = MAP_FAILED;
    int fd = -1, ret = -1;

    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd) ||
        getrandom(cookie, TOKEN_BYTES, 0) != TOKEN_BYTES) {
        ret = -errno;
        goto out;
    }
    for (int i = 0; i < TOKEN_BYTES; i++)
        p += snprintf(p, 3, "%02x", rnd[i]);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        ret = -errno;
        goto out;
    }
    /* The memory is reserved here: a /dev/shm too small to hold the ring fails now (the link
     * goes over TCP), not with SIGBUS at the first copy past what it could hold. */
    if ((ret = -posix_fallocate(fd, 0, (off_t)(SHM_DATA_OFF + bytes))) < 0 ||
        (map = mmap(NULL, SHM_DATA_OFF + bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                    fd, 0)) == MAP_FAILED) {
        ret = ret < 0 ? ret : -errno;
        shm_unlink(name);
        goto out;
    }
    /* A new file reads as zeros: head, tail and both flags start at 0. */
    memcpy(((struct coll_shm_ring *)map)->cookie, cookie, TOKEN_BYTES);
    ((struct coll_shm_ring *)map)->bytes = bytes;
    *out = map;
    ret = 0;
out:
    if (fd >= 0)
        close(fd);
    return ret;
}

bool coll_shm_attach(const char *name, const unsigned char *cookie, struct coll_shm_ring **out)
{
    struct stat st;
    void *map = MAP_FAILED;
    size_t bytes = 0;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);

    if (fd < 0)
        return false;
    /* Either of the two sizes: the other end's machine view may be its own. */
    if (fstat(fd, &st) == 0 && st.st_size > SHM_DATA_OFF)
        bytes = (size_t)st.st_size - SHM_DATA_OFF;
    if (bytes == SHM_RING_NEAR_BYTES || bytes == SHM_RING_FAR_BYTES)
        map = mmap(NULL, SHM_DATA_OFF + bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return false;
    if (memcmp(((struct coll_shm_ring *)map)->cookie, cookie, TOKEN_BYTES) ||
        ((struct coll_shm_ring *)map)->bytes != bytes) {
        munmap(map, SHM_DATA_OFF + bytes);
        return false;
    }
    *out = map;
    return true;
}

void coll_shm_detach(struct coll_shm_ring **r)
{
    if (*r)
        munmap(*r, SHM_DATA_OFF + (*r)->bytes);
    *r = NULL;
}

/* A spinning CPU's hint to the core that it waits (and to a sibling hyperthread). */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* One turn of a look at a shared ring: a pause, with the CPU given away every 32nd turn (so
 * that two ranks the scheduler happens to put on one CPU do not each spin out their whole
 * look while the other waits for the CPU), and every turn when oversubscribed. */
static void relax(const struct coll_tcp *tcp, unsigned turn)
{
    if (tcp->oversubscribed || turn % 32 == 31)
        sched_yield();
    else
        cpu_relax();
}

/* --- the data path --------------------------------------------------------------------------- */

/* Rings a shared-memory link's doorbell: one byte on its TCP connection. A peer that has
 * closed does not need waking (and if it died, the data path says so), so errors are left. */
static void doorbell(int fd)
{
    char b = 0;

    if (fd >= 0)
        while (send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == EINTR)
            ;
}

/* Every operation's stream on a shared ring starts at a multiple of SHM_PAD: both sides skip
 * the same padding before their first byte of the operation, so that elements never straddle
 * the end of the ring. */
static uint64_t shm_pad(uint64_t pos, bool aligned)
{
    return aligned ? 0 : (SHM_PAD - pos % SHM_PAD) % SHM_PAD;
}

/* How many bytes of the current receive step can be taken from the ring in one piece (whole
 * elements when they are added), and where they start. */
static size_t shm_recv_usable(const struct coll_xfer *x, uint64_t *from)
{
    struct coll_shm_ring *r = x->tcp->recv_ring;
    uint64_t tail = atomic_load(&r->tail), avail = atomic_load(&r->head) - tail;
    uint64_t pad = shm_pad(tail, x->raligned);
    size_t off, n = x->rlen - x->ro;

    /* The sender stores its padding with its first bytes: no more than padding is nothing. */
    if (avail <= pad)
        return 0;
    *from = tail + pad;
    off = (size_t)(*from % r->bytes);
    if (n > avail - pad)
        n = (size_t)(avail - pad);
    if (n > r->bytes - off)
        n = r->bytes - off;
    if (n > SHM_PIECE_BYTES)
        n = SHM_PIECE_BYTES;
    if (x->rreduce)
        n -= n % x->elem;
    return n;
}

/* Straight from the ring: no staging buffer. */
int coll_shm_recv(struct coll_xfer *x)
{
    struct coll_tcp *tcp = x->tcp;
    struct coll_shm_ring *r = tcp->recv_ring;
    uint64_t from = 0;
    size_t n = shm_recv_usable(x, &from);
    const char *src = (const char *)r + SHM_DATA_OFF + from % r->bytes;

    if (n == 0)
        return 0;
    if (x->rreduce)
        x->add(x->rp + x->ro, src, n / x->elem);
    else
        memcpy(x->rp + x->ro, src, n);
    x->ro += n;
    x->rc = x->ro;
    x->raligned = true;
    atomic_store(&r->tail, from + n);
    if (atomic_exchange(&r->send_waiting, 0))
        doorbell(tcp->recv_fd);
    return 1;
}

/* How many bytes of the current send step fit in the ring in one piece, and where. */
static size_t shm_send_usable(const struct coll_xfer *x, uint64_t *at)
{
    struct coll_shm_ring *r = x->tcp->send_ring;
    uint64_t head = atomic_load(&r->head), used = head - atomic_load(&r->tail);
    uint64_t pad = shm_pad(head, x->saligned), space = r->bytes - used;
    size_t limit = coll_xfer_send_limit(x), off, n;

    if (limit <= x->so || space <= pad)
        return 0;
    *at = head + pad;
    off = (size_t)(*at % r->bytes);
    n = limit - x->so;
    if (n > space - pad)
        n = (size_t)(space - pad);
    if (n > r->bytes - off)
        n = r->bytes - off;
    if (n > SHM_PIECE_BYTES)
        n = SHM_PIECE_BYTES;
    return n;
}

int coll_shm_send(struct coll_xfer *x)
{
    struct coll_tcp *tcp = x->tcp;
    struct coll_shm_ring *r = tcp->send_ring;
    uint64_t at = 0;
    size_t n = shm_send_usable(x, &at);

    if (n == 0)
        return 0;
    memcpy((char *)r + SHM_DATA_OFF + at % r->bytes, x->sp + x->so, n);
    x->so += n;
    x->saligned = true;
    atomic_store(&r->head, at + n);
    if (atomic_exchange(&r->recv_waiting, 0))
        doorbell(tcp->send_fd);
    return 1;
}

bool coll_shm_recv_ready(struct coll_xfer *x)
{
    uint64_t from;

    atomic_store(&x->tcp->recv_ring->recv_waiting, 1);
    return shm_recv_usable(x, &from) > 0;
}

bool coll_shm_send_ready(struct coll_xfer *x)
{
    uint64_t at;

    atomic_store(&x->tcp->send_ring->send_waiting, 1);
    return shm_send_usable(x, &at) > 0;
}

bool coll_shm_spin(struct coll_xfer *x, bool recv, bool send)
{
    int64_t until =
        monotime_us() + (x->tcp->oversubscribed ? SHM_SPIN_OVERSUBSCRIBED_US : SHM_SPIN_US);
    uint64_t pos;

    for (unsigned turn = 0;; turn++) {
        if (recv && shm_recv_usable(x, &pos) > 0)
            return true;
        if (send && shm_send_usable(x, &pos) > 0)
            return true;
        relax(x->tcp, turn);
        /* Every turn when each gives the CPU away: a yield may last a time slice. */
        if ((x->tcp->oversubscribed || turn % 64 == 63) && monotime_us() >= until)
            return false;
    }
}
