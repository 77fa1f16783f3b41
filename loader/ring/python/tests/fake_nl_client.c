/* A stand-in for libnl_client.so with no producer behind it, for testing the
 * Python binding's own logic (release order, events, errors) deterministically.
 * The job id picks the behaviour:
 *   "missing"     attach fails (NL_ERROR, text from nl_attach_error)
 *   "slow"        attach times out (NL_TIMEOUT, after waiting timeout_s)
 *   "error"       two batches, then NL_ERROR with a producer's text
 *   "stuck"       one batch, then NL_TIMEOUT (after waiting timeout_s, as a real client)
 *   contains "nhwc" / "float": that layout / dtype
 *   anything else 2 epochs of 3 batches of 4 (the last 2), 3x2x2 pixels, 2 slots.
 * Batch with sequence s (epoch e, batch b), sample i: pixel byte k of the batch
 * = (s * 7 + k) & 0xff (float32: the value s * 1000 + k), label e * 10 + b * 2 + i,
 * index s * 100 + i.
 * A released slot is overwritten with 0xEE bytes, as a producer refilling it would. */
#define _POSIX_C_SOURCE 200809L  /* nanosleep */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "numa_loader/nl_client.h"

enum { kSlots = 2, kBatch = 4, kPerEpoch = 3, kEpochs = 2 };

struct nl_client {
  nl_info info;
  char job[64];
  unsigned char* slot_mem[kSlots];
  int held[kSlots];
  uint64_t epoch, batch, sequence;
  char error[256];
};

static __thread char attach_error[256];

/* Waits as a real client would before NL_TIMEOUT (timeout_s < 0: an hour). */
static void pause_for(double timeout_s) {
  if (timeout_s < 0) timeout_s = 3600;
  struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }  /* a signal does not end it, as it does not end a condition-variable wait */
}

static size_t slot_bytes(const nl_client* c) { return kBatch * (c->info.sample_bytes + 16); }

int nl_attach(const char* job_id, int rank, double timeout_s, nl_client** out) {
  *out = NULL;
  if (strcmp(job_id, "missing") == 0) {
    snprintf(attach_error, sizeof attach_error, "no producer for job 'missing' rank %d", rank);
    return NL_ERROR;
  }
  if (strcmp(job_id, "slow") == 0) {
    pause_for(timeout_s);
    snprintf(attach_error, sizeof attach_error, "job 'slow' rank %d: no producer within %.1f s", rank, timeout_s);
    return NL_TIMEOUT;
  }
  nl_client* c = calloc(1, sizeof *c);
  snprintf(c->job, sizeof c->job, "%s", job_id);
  c->info.slot_count = kSlots;
  c->info.batch_size = kBatch;
  c->info.channels = 3;
  c->info.height = 2;
  c->info.width = 2;
  c->info.dtype = strstr(job_id, "float") ? NL_DTYPE_FLOAT32 : NL_DTYPE_UINT8;
  c->info.layout = strstr(job_id, "nhwc") ? NL_LAYOUT_NHWC : NL_LAYOUT_NCHW;
  c->info.rank = rank;
  c->info.producer_pid = 4242;
  c->info.sample_bytes = 12 * (c->info.dtype == NL_DTYPE_FLOAT32 ? 4 : 1);
  c->info.batches_per_epoch = kPerEpoch;
  c->info.epochs = kEpochs;
  for (int i = 0; i < kSlots; ++i) c->slot_mem[i] = malloc(slot_bytes(c));
  *out = c;
  return NL_OK;
}

const char* nl_attach_error(void) { return attach_error; }

int nl_info_get(const nl_client* c, nl_info* out) {
  *out = c->info;
  return NL_OK;
}

static void fill(nl_client* c, int slot, nl_batch* b) {
  unsigned char* m = c->slot_mem[slot];
  uint32_t n = b->size;
  uint64_t s = b->sequence;
  if (c->info.dtype == NL_DTYPE_FLOAT32) {
    float* p = (float*)m;
    for (uint64_t i = 0; i < n * 12; ++i) p[i] = (float)(s * 1000 + i);
  } else {
    for (uint64_t i = 0; i < n * c->info.sample_bytes; ++i) m[i] = (unsigned char)((s * 7 + i) & 0xff);
  }
  int64_t* labels = (int64_t*)(m + kBatch * c->info.sample_bytes);
  int64_t* indices = labels + kBatch;
  for (uint32_t i = 0; i < n; ++i) {
    labels[i] = (int64_t)(b->epoch * 10 + b->batch * 2 + i);
    indices[i] = (int64_t)(s * 100 + i);
  }
  b->pixels = m;
  b->labels = labels;
  b->indices = indices;
}

int nl_next(nl_client* c, double timeout_s, nl_batch* out) {
  if (strcmp(c->job, "error") == 0 && c->sequence == 2) {
    snprintf(c->error, sizeof c->error,
             "job 'error' rank %d: producer pid 4242 failed: split 'train', shard train/shard-00000, "
             "index 5: payload CRC32C mismatch", c->info.rank);
    return NL_ERROR;
  }
  if (strcmp(c->job, "stuck") == 0 && c->sequence == 1) {
    pause_for(timeout_s);
    snprintf(c->error, sizeof c->error, "producer pid 4242 is alive but has sent nothing for %.1f s", timeout_s);
    return NL_TIMEOUT;
  }
  if (c->epoch >= kEpochs) {
    snprintf(c->error, sizeof c->error, "the producer's last epoch is out");
    return NL_END;
  }
  int slot = -1;
  for (int i = 0; i < kSlots; ++i)
    if (!c->held[i]) { slot = i; break; }
  if (slot < 0) {
    snprintf(c->error, sizeof c->error, "all %d slots are held: release one first", kSlots);
    return NL_ERROR;
  }
  c->held[slot] = 1;
  memset(out, 0, sizeof *out);
  out->slot = (uint32_t)slot;
  out->epoch = c->epoch;
  out->batch = c->batch;
  out->sequence = c->sequence++;
  out->position = out->sequence * 3 + 1;
  out->size = c->batch == kPerEpoch - 1 ? 2 : kBatch;
  fill(c, slot, out);
  if (++c->batch == kPerEpoch) {
    c->batch = 0;
    ++c->epoch;
  }
  return NL_OK;
}

int nl_release(nl_client* c, const nl_batch* b) {
  if (b->slot >= kSlots || !c->held[b->slot] || b->pixels != c->slot_mem[b->slot] ||
      b->position != b->sequence * 3 + 1) {
    snprintf(c->error, sizeof c->error, "release of slot %u, which is not held", b->slot);
    return NL_ERROR;
  }
  c->held[b->slot] = 0;
  memset(c->slot_mem[b->slot], 0xEE, slot_bytes(c));
  return NL_OK;
}

int nl_seek(nl_client* c, uint64_t epoch, uint64_t batch) {
  for (int i = 0; i < kSlots; ++i)
    if (c->held[i]) {
      snprintf(c->error, sizeof c->error, "seek with slot %d held", i);
      return NL_ERROR;
    }
  c->epoch = epoch;
  c->batch = batch;
  return NL_OK;
}

const char* nl_last_error(const nl_client* c) { return c->error; }

/* Counts goodbyes and detaches (fake_counts); a detach poisons the slots
 * before freeing them, so a view read after it shows 0xDD, not the batch. */
static int goodbyes, detaches;
void fake_counts(int* g, int* d) {
  *g = goodbyes;
  *d = detaches;
}
void nl_goodbye(nl_client* c) {
  if (c) ++goodbyes;
}
void nl_detach(nl_client* c) {
  if (!c) return;
  ++detaches;
  for (int i = 0; i < kSlots; ++i) {
    memset(c->slot_mem[i], 0xDD, slot_bytes(c));
    free(c->slot_mem[i]);
  }
  free(c);
}
