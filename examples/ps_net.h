/* SPDX-License-Identifier: MIT */
/*  ps_net.h: the parameter server of the PyTorch tutorial "Implementing a
    Parameter Server Using Distributed RPC Framework", holding the tutorial
    Net, optionally split over several server processes (shards).

    Layout with S shards (ranks 0..S-1): shard 0 holds conv1, conv2 and
    fc2; fc1 (96 % of the bytes) is split by output rows over all shards,
    shard 0 taking fewer rows so that every shard holds about the same
    number of bytes. Every shard builds the whole Net from the same seed
    and keeps its slice, so S does not change the initial weights.

    A trainer sends a batch to shard 0 (through an RRef to the server, as
    the tutorial does); shard 0 runs the convolutions, sends the features
    to the other shards for their rows of fc1, concatenates the parts and
    finishes with fc2 and log_softmax. Every step is recorded by
    distributed autograd, so the trainer's backward reaches every shard.

    Concurrent trainers: each forward works on a copy of the parameters
    taken under zd_dist_optim_read_lock() (a step of another trainer never
    changes what a running backward uses; forwards between two steps share
    one copy), and gradients flow back to the shared parameters through
    that copy. A trainer's
    gradients are therefore exact for the weights its forward saw, and
    updates from several trainers interleave whole: asynchronous SGD with
    a staleness of at most the number of trainers. */
#ifndef ZDIST_EXAMPLES_PS_NET_H
#define ZDIST_EXAMPLES_PS_NET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/*  Creates this process's shard (shard = its rank < num_shards) from the
    Net built with seed, and registers the server's functions:
      get_parameter_server()            -> the value an RRef to the server holds
      ps_forward(server, x, training)   -> log-probabilities (shard 0)
      ps_get_param_rrefs(server)        -> RRefs to every parameter slice
      ps_get_dist_gradients(server, cid)-> [[name, grad], ...] of all shards
      ps_dist_gradient_sizes(server, cid)-> [[name, elements], ...]: the same
                                           question, without the tensors
    and the trainers' registry (zd_ps_trainers_new, ps.h), whose shared
    result is the test accuracy of the final weights, once every trainer
    has finished, failed or was lost; it prints each trainer's failure,
    loss and rejoin.
    The test set is read from data_dir (NULL: the default place) when the
    first evaluation runs. Call after zd_dist_optim_init (it removes the
    backward guard that installs: the forwards run on copies) and before
    zd_rpc_init. Prints the split to out. Returns 0, or -1. */
int ps_net_serve(int shard, int num_shards, uint64_t seed, bool dropout, const char *data_dir,
                 FILE *out);

#define PS_NET_MAX_TRAINERS 64

/*  Checkpoints, after ps_net_serve and before zd_rpc_init, on
    every shard with the same prefix: the shard's parameters go to
    prefix.shardK with the checkpoint's generation number (the previous
    file stays as prefix.shardK.prev); shard 0's file also holds how many
    batches each trainer had done, and the run's batch size, seed and
    number of trainers. The functions this adds:
      ps_checkpoint(server, trainer, batches) -> none: shard 0 takes the
          next generation, has every other shard save it (ps_save_shard),
          then records the trainer's position and saves its own file last;
          each file is replaced whole (checkpoint.h)
      ps_resume_point(server, trainer) -> batches that trainer had done;
          when a shard came back from its files while the others ran
          (restarted with resume into the running world), shard 0 first
          has every shard load its last generation again (ps_reload_shard),
          so that weights and positions are of one checkpoint
    Temporary files this shard's writes left behind (a process killed
    mid-write) are removed first; then the shard checks that it can write
    there (a probe file created and removed) and refuses, naming the path,
    a prefix it cannot write. A write that fails (a full disk) leaves the
    shard's files as they were: the new generation is written whole to
    prefix.shardK.new before the files move. With resume, the shard loads its file of
    shard 0's generation (its .prev one when a checkpoint did not reach
    shard 0), refusing (with the files and their generations named) a mix
    of generations, a missing or damaged file, one of another layout, or
    one of a run with another batch size, seed or number of trainers. With
    several trainers the shards are saved while others step: a trainer may
    redo up to a checkpoint interval of batches, never skip one. 0, or -1. */
int ps_net_checkpoint_enable(const char *prefix, bool resume, int64_t batch_size, int num_trainers);

/*  The largest batch ps_forward takes (--max_batch_size; 0: 1024). A
    larger one, or one that is not [N,1,28,28] float32, is refused with an
    error naming the caller: a peer cannot make the server allocate
    activations without bound. Call before zd_rpc_init. */
void ps_net_set_max_batch(int64_t n);

/*  How many training forwards this shard holds at once, between their
    forward and the end of their backward here (--max_inflight; 0: 2 per
    core, -1: no limit). Later ones wait, in order, for one to finish:
    the server's memory stays that of n batches (about 10 MB each for a
    batch of 32) however many trainers there are. Call before
    zd_rpc_init. */
void ps_net_set_max_inflight(int n);

/*  How many fc1 rows shard s of S holds, and the first one. */
void ps_net_fc1_rows(int shard, int num_shards, int *first, int *count);

/*  On shard 0 after the world finished: the samples of every training
    forward it served (those of trainers lost or failed on the way too) and
    the seconds from the first trainer's start to the last trainer's finish
    or last training forward, whichever came later (0 when none). */
void ps_net_throughput(int64_t *samples, double *seconds);

/*  On shard 0 after the world finished: prints a line to out for each
    trainer that failed (its rank, the batch it was at and its error) or
    was lost (its rank and the batch it was at) and returns how many
    trainers finished their batches. */
int ps_net_trainers_report(FILE *out);

/*  On shard 0: how many trainers said their run failed, and the first
    one's "trainer rank R failed at batch B: why" in first (of size). */
int ps_net_trainers_failed(char *first, size_t size);

/*  On shard 0 before its shutdown: waits until every trainer has finished
    its batches, said that its run failed (zd_ps_trainer_failed), or was lost
    and has not come back within wait_s seconds.
    A graceful zd_rpc_shutdown stops taking back restarted processes (rank
    0's rendezvous closes), and a server calls it as soon as it serves: with
    checkpoints, a trainer restarted into the running world must still find
    the rendezvous open. */
void ps_net_wait_trainers(double wait_s);

/*  Weights under PyTorch's names (ps_net_export.c), before ps_net_serve:
    with an init_from path every shard builds the Net from that
    safetensors file (strictly: the Net's 8 tensors and shapes) instead of
    the seed (--resume's checkpoint still wins); with a save_model path
    shard 0 writes the whole Net, gathered from every shard, to that file
    after the shared final evaluation, with "step" (training batches the
    servers served), "test_accuracy" and "test_images" in its metadata.
    NULL or "": not wanted. */
void ps_net_set_init_from(const char *path);
void ps_net_set_save_model(const char *path);

/*  On shard 0 after the world finished: 1 when the --save_model file was
    written, 0 when no evaluation ran to write it, -1 when writing failed;
    *why says why not (borrowed). */
int ps_net_save_model_result(const char **why);

/*  Frees the shard's state (after zd_rpc_shutdown). */
void ps_net_free(void);

#endif
