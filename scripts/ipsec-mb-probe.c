/* Two questions about Intel's IPsec-MB that BENCHMARKS.md answers with this program (built and run by
 * ipsec-mb-probe.sh; measurement only, the library does the cryptography):
 * 1. How much of the library's code does making a manager map into the process (file pages, RssFile), with
 *    init_mb_mgr_auto as turbotun's glue (crates/turbotun/src/sys/ipsec_mb.c) calls it and with only the AVX-512
 *    manager's init?
 * 2. Does the burst API (many jobs per call) seal and open ChaCha20-Poly1305 faster than one job per call, as the
 *    glue submits them? Times 64 packets of 1420 B sealed and opened in place each way, rounds interleaved, and
 *    checks that both ways give the same tags and that every open's tag matches its seal's. */
#include <intel-ipsec-mb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PACKETS 64
#define LEN 1420
#define ITERATIONS 4000

static uint8_t text[PACKETS][LEN], key[32], nonce[PACKETS][12], tags[2][PACKETS][16];

static double seconds(void)
{
        struct timespec t;

        clock_gettime(CLOCK_MONOTONIC, &t);
        return t.tv_sec + t.tv_nsec * 1e-9;
}

static void describe(IMB_JOB *job, int i, int encrypt, uint8_t *tag)
{
        job->cipher_mode = IMB_CIPHER_CHACHA20_POLY1305;
        job->hash_alg = IMB_AUTH_CHACHA20_POLY1305;
        job->cipher_direction = encrypt ? IMB_DIR_ENCRYPT : IMB_DIR_DECRYPT;
        job->chain_order = encrypt ? IMB_ORDER_CIPHER_HASH : IMB_ORDER_HASH_CIPHER;
        job->enc_keys = key;
        job->dec_keys = key;
        job->key_len_in_bytes = 32;
        job->src = text[i];
        job->dst = text[i];
        job->cipher_start_src_offset_in_bytes = 0;
        job->msg_len_to_cipher_in_bytes = LEN;
        job->hash_start_src_offset_in_bytes = 0;
        job->msg_len_to_hash_in_bytes = LEN;
        job->iv = nonce[i];
        job->iv_len_in_bytes = 12;
        job->u.CHACHA20_POLY1305.aad = NULL;
        job->u.CHACHA20_POLY1305.aad_len_in_bytes = 0;
        job->auth_tag_output = tag;
        job->auth_tag_output_len_in_bytes = 16;
}

/* Every packet sealed then opened, one job per call; the seal's tags go to tags[0]. */
static int one_by_one(IMB_MGR *mgr)
{
        uint8_t opened[16];

        for (int encrypt = 1; encrypt >= 0; encrypt--)
                for (int i = 0; i < PACKETS; i++) {
                        IMB_JOB *job = IMB_GET_NEXT_JOB(mgr);

                        describe(job, i, encrypt, encrypt ? tags[0][i] : opened);
                        job = IMB_SUBMIT_JOB_NOCHECK(mgr);
                        if (job == NULL)
                                job = IMB_FLUSH_JOB(mgr);
                        if (job == NULL || job->status != IMB_STATUS_COMPLETED)
                                return -1;
                        if (!encrypt && memcmp(opened, tags[0][i], 16) != 0)
                                return -1;
                }
        return 0;
}

/* The same as one burst of seals and one of opens; the seal's tags go to tags[1]. */
static int in_bursts(IMB_MGR *mgr)
{
        static uint8_t opened[PACKETS][16];
        IMB_JOB *jobs[PACKETS];

        for (int encrypt = 1; encrypt >= 0; encrypt--) {
                if (IMB_GET_NEXT_BURST(mgr, PACKETS, jobs) < PACKETS)
                        return -1;
                for (int i = 0; i < PACKETS; i++)
                        describe(jobs[i], i, encrypt, encrypt ? tags[1][i] : opened[i]);
                uint32_t done = IMB_SUBMIT_BURST_NOCHECK(mgr, PACKETS, jobs);

                if (done < PACKETS)
                        done += IMB_FLUSH_BURST(mgr, PACKETS - done, jobs + done);
                if (done != PACKETS)
                        return -1;
                for (int i = 0; i < PACKETS; i++)
                        if (jobs[i]->status != IMB_STATUS_COMPLETED ||
                            (!encrypt && memcmp(opened[i], tags[1][i], 16) != 0))
                                return -1;
        }
        return 0;
}

/* The process's file-backed resident memory, kB. */
static long rss_file_kb(void)
{
        char line[256];
        long kb = -1;
        FILE *status = fopen("/proc/self/status", "r");

        if (status == NULL)
                return -1;
        while (fgets(line, sizeof(line), status) != NULL)
                if (sscanf(line, "RssFile: %ld", &kb) == 1)
                        break;
        fclose(status);
        return kb;
}

int main(int argc, char **argv)
{
        int rounds = argc > 1 ? atoi(argv[1]) : 5;
        int avx512_only = argc > 2 && strcmp(argv[2], "avx512") == 0;
        IMB_MGR *mgr = alloc_mb_mgr(0);

        if (mgr == NULL)
                return 1;
        long before = rss_file_kb();

        if (avx512_only)
                init_mb_mgr_avx512(mgr);
        else
                init_mb_mgr_auto(mgr, NULL);
        if (imb_get_errno(mgr) != 0)
                return 1;
        printf("%s: file pages mapped by the manager's init: %ld kB\n", avx512_only ? "init_mb_mgr_avx512" :
               "init_mb_mgr_auto", rss_file_kb() - before);
        for (int i = 0; i < PACKETS; i++) {
                memset(text[i], i, LEN);
                nonce[i][4] = (uint8_t)i;
        }
        printf("arch %d (5 = AVX-512); us per packet, seal + open of %d B, %d packets a call or one\n", mgr->used_arch,
               LEN, PACKETS);
        for (int r = 0; r < rounds; r++) {
                double t0 = seconds();

                for (int n = 0; n < ITERATIONS; n++)
                        if (one_by_one(mgr) != 0)
                                return 2;
                double t1 = seconds();

                for (int n = 0; n < ITERATIONS; n++)
                        if (in_bursts(mgr) != 0)
                                return 2;
                double t2 = seconds();

                if (memcmp(tags[0], tags[1], sizeof(tags[0])) != 0)
                        return 3;
                double single = (t1 - t0) / ITERATIONS / PACKETS * 1e6, burst = (t2 - t1) / ITERATIONS / PACKETS * 1e6;

                printf("round %d: one job a call %.3f, burst %.3f, burst speed-up %.3fx\n", r + 1, single, burst,
                       single / burst);
        }
        free_mb_mgr(mgr);
        return 0;
}
