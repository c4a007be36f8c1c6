/* Glue between the Rust bench and Intel's IPsec-MB library (Debian's libipsec-mb-dev): one AEAD job per call, the
 * job's fields set through the library's own header so that no struct layout is copied into Rust. No
 * cryptography here; the library seals and opens, and the caller compares tags. */
#include <intel-ipsec-mb.h>
#include <stdint.h>

IMB_MGR *tt_imb_new(void)
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

void tt_imb_free(IMB_MGR *mgr)
{
        free_mb_mgr(mgr);
}

/* The manager's architecture (IMB_ARCH: 5 is AVX-512). */
int tt_imb_arch(const IMB_MGR *mgr)
{
        return (int)mgr->used_arch;
}

/* Seals (encrypt != 0) or opens buf[0..len] in place with ChaCha20-Poly1305, no associated data, writing the tag it
 * computes to tag[16]. Returns 0 when the job completed. */
int tt_imb_chacha20_poly1305(IMB_MGR *mgr, const uint8_t *key, const uint8_t *nonce, uint8_t *buf, uint64_t len,
                             uint8_t *tag, int encrypt)
{
        IMB_JOB *job = IMB_GET_NEXT_JOB(mgr);

        job->cipher_mode = IMB_CIPHER_CHACHA20_POLY1305;
        job->hash_alg = IMB_AUTH_CHACHA20_POLY1305;
        job->cipher_direction = encrypt ? IMB_DIR_ENCRYPT : IMB_DIR_DECRYPT;
        job->chain_order = encrypt ? IMB_ORDER_CIPHER_HASH : IMB_ORDER_HASH_CIPHER;
        job->enc_keys = key;
        job->dec_keys = key;
        job->key_len_in_bytes = 32;
        job->src = buf;
        job->dst = buf;
        job->cipher_start_src_offset_in_bytes = 0;
        job->msg_len_to_cipher_in_bytes = len;
        job->hash_start_src_offset_in_bytes = 0;
        job->msg_len_to_hash_in_bytes = len;
        job->iv = nonce;
        job->iv_len_in_bytes = 12;
        job->u.CHACHA20_POLY1305.aad = NULL;
        job->u.CHACHA20_POLY1305.aad_len_in_bytes = 0;
        job->auth_tag_output = tag;
        job->auth_tag_output_len_in_bytes = 16;
        job = IMB_SUBMIT_JOB(mgr);
        if (job == NULL)
                job = IMB_FLUSH_JOB(mgr);
        return job != NULL && job->status == IMB_STATUS_COMPLETED ? 0 : -1;
}
