/* SPDX-License-Identifier: MIT */
/*  fuzz_safetensors.c: libFuzzer target for the safetensors reader
    (data/safetensors.c).

    The input is a whole file. The reader gets an exact-size heap copy of
    it, as zd_safetensors_read gives it the file's mapping, so that ASan
    sees any read past the end; tensors borrow the copy where aligned.

    Checks, beyond "no crash, no sanitizer report": every byte of every
    tensor read is readable; what was read writes (into memory), that reads
    again to the same names, dtypes, shapes, bytes and metadata, and writes
    again to the very same bytes (the writer's layout is canonical); a
    refused input leaves an error naming the file; each copy is released
    exactly once, when the last tensor borrowing it goes; no tensor
    outlives the run. A violated check aborts, which libFuzzer reports.

    Build and run with tools/fuzz.sh 600 fuzz_safetensors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "data/safetensors_private.h"

#define FUZZ_NAME "fuzz_safetensors"
#include "tools/fuzz_check.h"

static int released;

static void release_copy(void *data, size_t size)
{
    (void)size;
    released++;
    free(data);
}

/*  Parses size bytes (taking data, malloc'd); CHECKs what a refusal must be. */
static zd_named_tensors_t *parse(void *data, size_t size, zd_strings_t **kv)
{
    int before = released;
    zd_named_tensors_t *nt = zd__safetensors_parse("in.safetensors", data, size, release_copy, kv);
    if (!nt) {
        CHECK(released == before + 1, "a refused input was released %d times", released - before);
        CHECK(strncmp(zd_error_last(), "safetensors: in.safetensors: ", 29) == 0,
              "the error \"%s\" does not name the file", zd_error_last());
        CHECK(*kv == NULL, "a refused input left metadata");
    }
    return nt;
}

/*  The file's bytes for nt and its metadata, written into memory. */
static char *write_mem(const zd_named_tensors_t *nt, const zd_strings_t *kv, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    CHECK(f, "open_memstream failed");
    int rc = zd__safetensors_write_stream(f, "out.safetensors", nt, kv);
    CHECK(fclose(f) == 0, "open_memstream's fclose failed");
    CHECK(rc == 0, "what was read does not write: %s", zd_error_last());
    return buf;
}

static unsigned touch(const zd_named_tensors_t *nt)
{
    unsigned sum = 0;
    for (int i = 0; i < zd_named_tensors_len(nt); i++) {
        const zd_tensor_t *t = zd_named_tensors_tensor(nt, i);
        const unsigned char *p = zd_tensor_raw(t);
        for (size_t k = 0; k < zd_tensor_nbytes(t); k++)
            sum += p[k];
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t live = zd_tensor_live_count();
    released = 0;
    void *copy = malloc(size ? size : 1);
    CHECK(copy, "out of memory");
    if (size)
        memcpy(copy, data, size);
    zd_strings_t *kv, *kv2;
    zd_named_tensors_t *nt = parse(copy, size, &kv);
    if (!nt) {
        CHECK(zd_tensor_live_count() == live, "a refused input left tensors");
        return 0;
    }
    volatile unsigned sum = touch(nt);
    (void)sum;

    size_t len, len2;
    char *out = write_mem(nt, kv, &len);
    char *again = malloc(len);
    CHECK(again, "out of memory");
    memcpy(again, out, len);
    zd_named_tensors_t *nt2 = parse(again, len, &kv2);
    CHECK(nt2, "what was written does not read: %s", zd_error_last());
    int n = zd_named_tensors_len(nt);
    CHECK(zd_named_tensors_len(nt2) == n, "%d tensors read back as %d", n,
          zd_named_tensors_len(nt2));
    for (int i = 0; i < n; i++) {
        const char *name = zd_named_tensors_name(nt, i);
        const zd_tensor_t *a = zd_named_tensors_tensor(nt, i),
                          *b = zd_named_tensors_find(nt2, name);
        CHECK(b, "tensor '%s' lost in the round trip", name);
        CHECK(zd_tensor_dtype(a) == zd_tensor_dtype(b) && zd_tensor_same_shape(a, b) &&
                  memcmp(zd_tensor_raw(a), zd_tensor_raw(b), zd_tensor_nbytes(a)) == 0,
              "tensor '%s' changed in the round trip", name);
    }
    int n_kv = zd_strings_len(kv);
    CHECK(zd_strings_len(kv2) == n_kv, "%d metadata strings read back as %d", n_kv,
          zd_strings_len(kv2));
    for (int i = 0; i < n_kv; i++)
        CHECK(strcmp(zd_strings_get(kv, i), zd_strings_get(kv2, i)) == 0,
              "metadata \"%s\" read back as \"%s\"", zd_strings_get(kv, i), zd_strings_get(kv2, i));
    char *out2 = write_mem(nt2, kv2, &len2);
    CHECK(len2 == len && memcmp(out, out2, len) == 0, "writing what was written changes it");
    free(out);
    free(out2);

    zd_strings_free(kv);
    zd_strings_free(kv2);
    zd_named_tensors_free(nt);
    zd_named_tensors_free(nt2);
    CHECK(released == 2, "the two copies were released %d times together", released);
    CHECK(zd_tensor_live_count() == live, "%lld tensors outlive the run",
          (long long)(zd_tensor_live_count() - live));
    return 0;
}
