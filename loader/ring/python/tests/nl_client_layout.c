/* Prints the C layout of nl_client.h's structs and constants as JSON, so the
 * Python package's ctypes mirrors can be compared with what the compiler does. */
#include <stddef.h>
#include <stdio.h>

#include "numa_loader/nl_client.h"

#define FIELD(T, f) printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #f, offsetof(T, f), sizeof(((T*)0)->f)), first = 0

int main(void) {
  int first = 1;
  printf("{\"nl_info\": {\"size\": %zu, \"align\": %zu, \"fields\": {", sizeof(nl_info), _Alignof(nl_info));
  FIELD(nl_info, slot_count); FIELD(nl_info, batch_size); FIELD(nl_info, channels);
  FIELD(nl_info, height); FIELD(nl_info, width); FIELD(nl_info, dtype); FIELD(nl_info, layout);
  FIELD(nl_info, rank); FIELD(nl_info, producer_pid); FIELD(nl_info, reserved);
  FIELD(nl_info, sample_bytes); FIELD(nl_info, batches_per_epoch); FIELD(nl_info, epochs);
  first = 1;
  printf("}}, \"nl_batch\": {\"size\": %zu, \"align\": %zu, \"fields\": {", sizeof(nl_batch), _Alignof(nl_batch));
  FIELD(nl_batch, pixels); FIELD(nl_batch, labels); FIELD(nl_batch, indices); FIELD(nl_batch, size);
  FIELD(nl_batch, slot); FIELD(nl_batch, epoch); FIELD(nl_batch, batch); FIELD(nl_batch, sequence);
  FIELD(nl_batch, position);
  FIELD(nl_batch, wait_s);
  printf("}}, \"constants\": {\"NL_OK\": %d, \"NL_END\": %d, \"NL_TIMEOUT\": %d, \"NL_ERROR\": %d, "
         "\"NL_DTYPE_UINT8\": %d, \"NL_DTYPE_FLOAT32\": %d, \"NL_LAYOUT_NCHW\": %d, \"NL_LAYOUT_NHWC\": %d}}\n",
         NL_OK, NL_END, NL_TIMEOUT, NL_ERROR, NL_DTYPE_UINT8, NL_DTYPE_FLOAT32, NL_LAYOUT_NCHW,
         NL_LAYOUT_NHWC);
  return 0;
}
