// The C API (nl_client.h) over RingClient. No exception crosses it.
#include "numa_loader/nl_client.h"

#include <memory>
#include <new>
#include <string>

#include "loader/ring/client.h"

struct nl_client {
  std::unique_ptr<nl::RingClient> client;
  std::string error;
};

namespace {

thread_local std::string attach_error;

int CodeOf(const nl::Status& s) {
  switch (s.code()) {
    case nl::StatusCode::kOk:
      return NL_OK;
    case nl::StatusCode::kOutOfRange:
      return NL_END;
    case nl::StatusCode::kDeadlineExceeded:
      return NL_TIMEOUT;
    default:
      return NL_ERROR;
  }
}

int Fail(nl_client* c, const nl::Status& s) {
  c->error = s.message();
  return CodeOf(s);
}

}  // namespace

extern "C" {

int nl_attach(const char* job_id, int rank, double timeout_s, nl_client** out) {
  if (out == nullptr || job_id == nullptr) {
    attach_error = "nl_attach: job_id and out must not be NULL";
    return NL_ERROR;
  }
  *out = nullptr;
  try {
    auto client = nl::RingClient::Attach(job_id, rank, timeout_s);
    if (!client.ok()) {
      attach_error = client.status().message();
      return client.status().code() == nl::StatusCode::kDeadlineExceeded ? NL_TIMEOUT : NL_ERROR;
    }
    auto* c = new nl_client;
    c->client = std::move(*client);
    *out = c;
    attach_error.clear();
    return NL_OK;
  } catch (const std::exception& e) {
    attach_error = std::string("nl_attach: ") + e.what();
    return NL_ERROR;
  }
}

const char* nl_attach_error(void) { return attach_error.c_str(); }

int nl_info_get(const nl_client* c, nl_info* out) {
  if (c == nullptr || out == nullptr) return NL_ERROR;
  const nl::RingInfo& i = c->client->info();
  *out = nl_info{};
  out->slot_count = i.geometry.slot_count;
  out->batch_size = i.geometry.batch_size;
  out->channels = i.geometry.channels;
  out->height = i.geometry.height;
  out->width = i.geometry.width;
  out->dtype = static_cast<uint32_t>(i.geometry.dtype);
  out->layout = static_cast<uint32_t>(i.geometry.layout);
  out->rank = i.rank;
  out->producer_pid = i.producer_pid;
  out->sample_bytes = i.geometry.sample_bytes;
  out->batches_per_epoch = i.batches_per_epoch;
  out->epochs = i.epochs;
  return NL_OK;
}

int nl_next(nl_client* c, double timeout_s, nl_batch* out) {
  if (c == nullptr || out == nullptr) return NL_ERROR;
  try {
    auto b = c->client->Next(timeout_s);
    if (!b.ok()) return Fail(c, b.status());
    *out = nl_batch{};
    out->pixels = b->pixels;
    out->labels = b->labels;
    out->indices = b->indices;
    out->size = b->size;
    out->slot = b->slot;
    out->epoch = b->epoch;
    out->batch = b->batch;
    out->sequence = b->sequence;
    out->position = b->position;
    out->wait_s = b->wait_s;
    return NL_OK;
  } catch (const std::exception& e) {
    return Fail(c, nl::Status::Internal(e.what()));
  }
}

int nl_release(nl_client* c, const nl_batch* b) {
  if (c == nullptr || b == nullptr) return NL_ERROR;
  nl::RingBatch rb;
  rb.slot = b->slot;
  rb.sequence = b->sequence;
  rb.position = b->position;
  try {
    const nl::Status s = c->client->Release(rb);
    return s.ok() ? NL_OK : Fail(c, s);
  } catch (const std::exception& e) {
    return Fail(c, nl::Status::Internal(e.what()));
  }
}

int nl_seek(nl_client* c, uint64_t epoch, uint64_t batch) {
  if (c == nullptr) return NL_ERROR;
  try {
    const nl::Status s = c->client->Seek(epoch, batch);
    return s.ok() ? NL_OK : Fail(c, s);
  } catch (const std::exception& e) {
    return Fail(c, nl::Status::Internal(e.what()));
  }
}

const char* nl_last_error(const nl_client* c) {
  return c == nullptr ? "nl_client is NULL" : c->error.c_str();
}

void nl_goodbye(nl_client* c) {
  if (c != nullptr) c->client->Goodbye();
}

void nl_detach(nl_client* c) { delete c; }

}  // extern "C"
