/* The loader service's consumer side as a plain C API (libnl_client.so).
 *
 * A `loader serve --job-id J --rank R` process fills a shared-memory ring
 * with whole batches; a consumer attaches to it by (J, R) and takes them in
 * order. No LibTorch, no C++ in the interface: Python (ctypes), Rust, Go
 * and C attach the same way.
 *
 *   nl_client* c = NULL;
 *   if (nl_attach("job1", 0, 30.0, &c) != NL_OK) { fprintf(stderr, "%s\n", nl_attach_error()); ... }
 *   nl_batch b;
 *   while (nl_next(c, 60.0, &b) == NL_OK) {
 *     use(b.pixels, b.labels, b.indices, b.size);   // views into the shared slot
 *     nl_release(c, &b);                            // the slot goes back to the producer
 *   }
 *   ... nl_last_error(c) says why the loop ended (NL_END: the producer's last epoch is out)
 *   nl_detach(c);
 *
 * Lifetime of a batch: its pointers view the producer's slot and stay valid
 * until nl_release() of that batch (or nl_detach()). Up to slot_count
 * batches may be held at once; nl_next() with all slots held fails with
 * NL_ERROR instead of waiting forever.
 *
 * Threads: one nl_client is used by one thread at a time.
 * Errors: every call returns a code; nl_last_error() (or nl_attach_error()
 * for a failed attach, per thread) gives the text, naming the job, rank and
 * producer pid, and the producer's own error text when it failed.
 */
#ifndef NL_CLIENT_H_
#define NL_CLIENT_H_

#include <stdint.h>

#if defined(NL_CLIENT_BUILD)
#define NL_CLIENT_API __attribute__((visibility("default")))
#else
#define NL_CLIENT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
  NL_OK = 0,
  NL_END = 1,      /* the producer has served its last epoch (--epochs) */
  NL_TIMEOUT = 2,  /* the producer is alive but sent nothing within the timeout */
  NL_ERROR = 3,    /* the producer failed or died, the segment was refused, or a bad call */
};

enum { NL_DTYPE_UINT8 = 0, NL_DTYPE_FLOAT32 = 1 };
enum { NL_LAYOUT_NCHW = 0, NL_LAYOUT_NHWC = 1 };

typedef struct nl_client nl_client;

typedef struct nl_info {
  uint32_t slot_count;
  uint32_t batch_size;  /* samples in a full batch */
  uint32_t channels, height, width;
  uint32_t dtype;       /* NL_DTYPE_* */
  uint32_t layout;      /* NL_LAYOUT_* */
  int32_t rank;
  int32_t producer_pid;
  uint32_t reserved;
  uint64_t sample_bytes;
  uint64_t batches_per_epoch;
  uint64_t epochs;      /* 0: unbounded */
} nl_info;

typedef struct nl_batch {
  const void* pixels;      /* size * sample_bytes, in the ring's layout and dtype */
  const int64_t* labels;   /* size */
  const int64_t* indices;  /* size: the samples' global indices in the split */
  uint32_t size;           /* samples in this batch (the last of an epoch may be short) */
  uint32_t slot;
  uint64_t epoch, batch;   /* position: batch number within its epoch */
  uint64_t sequence;       /* 0, 1, ... over this client's batches */
  uint64_t position;       /* the ring's publication number (nl_release checks it) */
  double wait_s;           /* seconds nl_next waited for the producer (not the ring's own cost) */
} nl_batch;

/* Attaches to job `job_id`'s rank `rank`, waiting up to timeout_s for the
 * producer to appear. The producer's uid must be ours; the segment's magic,
 * version and geometry are checked. */
NL_CLIENT_API int nl_attach(const char* job_id, int rank, double timeout_s, nl_client** out);
NL_CLIENT_API const char* nl_attach_error(void);

NL_CLIENT_API int nl_info_get(const nl_client* c, nl_info* out);

/* The next batch in order. timeout_s < 0 waits as long as the producer is
 * alive. A producer's failure or death is reported (NL_ERROR) within about
 * a second; batches it published before are delivered first. */
NL_CLIENT_API int nl_next(nl_client* c, double timeout_s, nl_batch* out);
NL_CLIENT_API int nl_release(nl_client* c, const nl_batch* b);

/* Asks for batches from (epoch, batch) on, like DistributedSampler.set_epoch
 * (batch 0) or a resume mid-epoch. Only with no batch held. Batches already
 * published for the old position are dropped; the next nl_next() returns
 * the requested position. */
NL_CLIENT_API int nl_seek(nl_client* c, uint64_t epoch, uint64_t batch);

NL_CLIENT_API const char* nl_last_error(const nl_client* c);

/* Says goodbye to the producer (it exits cleanly) but keeps the ring mapped:
 * the pointers of batches delivered before stay readable (their last bytes)
 * until nl_detach. nl_next, nl_release and nl_seek fail after it. Calling it
 * twice is harmless; NULL is ignored. */
NL_CLIENT_API void nl_goodbye(nl_client* c);

/* Says goodbye to the producer (unless nl_goodbye did) and unmaps the ring.
 * Any held batch's pointers become invalid. NULL is ignored. */
NL_CLIENT_API void nl_detach(nl_client* c);

#ifdef __cplusplus
}
#endif

#endif /* NL_CLIENT_H_ */
