/* Glue between turbotun (src/sys/ipsec_mb.rs) and Intel's IPsec-MB library: a manager per thread and one
 * ChaCha20-Poly1305 job per call, the job's fields set through the library's own header so that no struct layout
 * of it is copied into Rust. No cryptography here: the library seals and opens; the caller compares tags. */
#include <intel-ipsec-mb.h>
#include <stdint.h>

IMB_MGR *turbotun_imb_new(void)
{
        IMB_MGR *mgr = alloc_mb_mgr(0);

        if (mgr == NULL)
                return NULL;
        init_mb_mgr_auto(mgr, NULL);
        if (imb_get_errno(mgr) != 0) {
                free_mb_mgr(mgr);
                return NULL;
        }
        return mgr;
}

void turbotun_imb_free(IMB_MGR *mgr)
{
        free_mb_mgr(mgr);
}

/* Whether the manager runs the AVX-512 code (IMB_ARCH_AVX512: AVX-512 ChaCha20, and IFMA Poly1305 where the CPU has
 * IFMA). */
int turbotun_imb_is_avx512(const IMB_MGR *mgr)
{
        return mgr->used_arch == IMB_ARCH_AVX512;
}

/* One seal or open (ipsec_mb.rs's AeadJob): buf[0..len] in place under a 32-byte key, a 12-byte nonce and
 * aad[0..aad_len]; the tag computed goes to tag[16]. */
struct turbotun_imb_aead {
        const uint8_t *key;
        const uint8_t *nonce;
        const uint8_t *aad;
        uint64_t aad_len;
        uint8_t *buf;
        uint64_t len;
        uint8_t *tag;
        int encrypt;
};

/* Seals (encrypt != 0) or opens with ChaCha20-Poly1305. Returns 0 when the job completed. */
int turbotun_imb_chacha20_poly1305(IMB_MGR *mgr, const struct turbotun_imb_aead *a)
{
        IMB_JOB *job = IMB_GET_NEXT_JOB(mgr);

        job->cipher_mode = IMB_CIPHER_CHACHA20_POLY1305;
        job->hash_alg = IMB_AUTH_CHACHA20_POLY1305;
        job->cipher_direction = a->encrypt ? IMB_DIR_ENCRYPT : IMB_DIR_DECRYPT;
        job->chain_order = a->encrypt ? IMB_ORDER_CIPHER_HASH : IMB_ORDER_HASH_CIPHER;
        job->enc_keys = a->key;
        job->dec_keys = a->key;
        job->key_len_in_bytes = 32;
        job->src = a->buf;
        job->dst = a->buf;
        job->cipher_start_src_offset_in_bytes = 0;
        job->msg_len_to_cipher_in_bytes = a->len;
        job->hash_start_src_offset_in_bytes = 0;
        job->msg_len_to_hash_in_bytes = a->len;
        job->iv = a->nonce;
        job->iv_len_in_bytes = 12;
        job->u.CHACHA20_POLY1305.aad = a->aad;
        job->u.CHACHA20_POLY1305.aad_len_in_bytes = a->aad_len;
        job->auth_tag_output = a->tag;
        job->auth_tag_output_len_in_bytes = 16;
        /* Submitted without the library's check of the job's fields, which is 2-3 % of a 1420-byte seal: the types
         * of ipsec_mb.rs fix everything it checks (a 32-byte key, a 12-byte nonce, a 16-byte tag, a valid pointer
         * for every length), and a packet is far below its length limit of 2^38 - 64 bytes. */
        job = IMB_SUBMIT_JOB_NOCHECK(mgr);
        /* ChaCha20-Poly1305 jobs complete on submit; a flush returns any job still held. */
        if (job == NULL)
                job = IMB_FLUSH_JOB(mgr);
        return job != NULL && job->status == IMB_STATUS_COMPLETED ? 0 : -1;
}
