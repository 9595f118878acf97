/* The index beside each rank log: logs/rank-N.idx holds one record per write the daemon made
 * to logs/rank-N.log, saying how long the log was after it and when it was written, so that
 * `gpurun logs` can put every rank's lines in the order they came out. Records are in the
 * writing host's byte order (the job dir is read where it was written, or by a machine of
 * the same kind); a record cut short by a crash is ignored. */
#ifndef GPURUN_LOGIDX_H
#define GPURUN_LOGIDX_H

#include <stdint.h>

struct log_index_record {
    int64_t end;     /* the log's size in bytes after the write */
    int64_t unix_ms; /* when it was written: milliseconds since the epoch, the host's clock */
};

#endif
