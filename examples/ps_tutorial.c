/* SPDX-License-Identifier: MIT */
/*  ps_tutorial: PyTorch's tutorial "Implementing a Parameter Server Using
    Distributed RPC Framework", written on the parameter-server layer's
    remote model (<zdist/ps.h>, zd_ps_model_*).

        ./ps_tutorial --world_size=4 --rank=0                       the server
        ./ps_tutorial --world_size=4 --rank=N --master_addr=HOST    trainer N
        tools/launch --nproc=4 -- ps_tutorial                       all four
        tools/launch --nproc=4 -- ps_tutorial --num_servers=2       the Net in two stages

    The tutorial's parts, in order below: ParameterServer (the Net, on
    rank 0), TrainerNet (the trainer's handle on it), run_training_loop,
    get_accuracy, and run_worker (main). With --num_servers=2 the Net is
    cut in two stages as the tutorial's model-parallel sequel does, its
    convolutions on rank 0 and its linear layers on rank 1, and each
    forward runs through both. rpc_ps is the same tutorial with
    everything an operator adds around it (shards, checkpoints, rejoin,
    staleness bounds); this program is the tutorial as it reads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/flags.h"
#include "examples/train_common.h"
#include <zdist/zdist.h>

#define EVAL_BATCH 500

typedef struct {
    flags_world_t world;
    const char *data_dir;
    int64_t batch_size, epochs, max_batches, seed, log_interval, eval_samples, max_batch_size;
    int64_t num_servers;
    double lr;
} options_t;

/*  ---- ParameterServer: the model lives here ---- */

/*  A stage of the Net: "NetConv" (conv1 .. flatten, 9216 features a
    sample) or "NetFc" (fc1 .. log_softmax). It holds the whole Net, built
    from the seed on each server alike so that the two halves are the
    Net one server would hold (the other half, unused here, costs 4.7 MB
    on rank 0), but lists only its half's parameters, the ones its server
    serves and steps. */
static int net_stage_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                             int n_out)
{
    zd_nn_module_t *net = zd_nn_module_state(m);
    if (n_in != 1 || n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: one input, one output",
                                 zd_nn_module_type(m));
    zd_nn_module_train(net, zd_nn_module_is_training(m)); /* dropout's mode is the stage's */
    return strcmp(zd_nn_module_type(m), "NetConv") == 0 ? zd_nn_net_forward_conv(net, in[0], out)
                                                        : zd_nn_net_forward_fc(net, in[0], out);
}

static void net_free(void *net)
{
    zd_nn_module_free(net);
}

/*  The model server `shard` serves: the Net with one server, else its
    half. A new module, or NULL. */
static zd_nn_module_t *server_model(const options_t *o, int shard)
{
    zd_nn_module_t *net = zd_nn_net_new((uint64_t)o->seed);
    if (!net || o->num_servers == 1)
        return net;
    const char *half = shard == 0 ? "conv" : "fc";
    zd_nn_module_t *stage =
        zd_nn_module_new(shard == 0 ? "NetConv" : "NetFc", net_stage_forward, net, net_free);
    for (int i = 0; stage && i < zd_nn_module_n_params(net); i++) {
        char name[64]; /* "conv1.weight" as "conv1_weight": a module's own names have no dots */
        snprintf(name, sizeof name, "%s", zd_nn_module_param_name(net, i));
        char *dot = strchr(name, '.');
        if (dot)
            *dot = '_';
        if (strncmp(name, half, strlen(half)) == 0 &&
            zd_nn_module_register_parameter(stage, name, zd_nn_module_param(net, i)) < 0) {
            zd_nn_module_free(stage);
            return NULL;
        }
    }
    return stage;
}

/*  Ranks below --num_servers: serve the Net (or its stage), built from
    the seed, until every trainer is done (the graceful shutdown waits for
    them). */
static int run_parameter_server(const options_t *o, int shard)
{
    zd_nn_module_t *model = server_model(o, shard);
    zd_ps_options_t po = zd_ps_options_default();
    /* a batch of images, or of the convolutions' features, no more */
    po.max_input_numel = o->max_batch_size * (shard == 0 ? 28 * 28 : 9216);
    zd_ps_model_server_t *srv =
        model ? zd_ps_model_server_new(model, shard, (int)o->num_servers, &po) : NULL;
    char name[32] = "parameter_server";
    if (o->num_servers > 1)
        snprintf(name, sizeof name, "parameter_server_%d", shard);
    int rc = srv && flags_world_init(&o->world, name, -1, "ps_tutorial") == 0 ? 0 : -1;
    if (rc == 0 && zd_rpc_shutdown(true, ZD_TIMEOUT_NONE) < 0)
        rc = -1;
    if (srv && o->num_servers > 1)
        printf("parameter server %d: %lld forwards served\n", shard,
               (long long)zd_ps_model_server_forwards(srv));
    else if (srv)
        printf("parameter server: %lld forwards served\n",
               (long long)zd_ps_model_server_forwards(srv));
    zd_ps_model_server_free(srv);
    zd_nn_module_free(model);
    return rc;
}

/*  ---- TrainerNet: the model as a trainer sees it ---- */

/*  The tutorial's TrainerNet holds an RRef to the server and gives the
    DistributedOptimizer its parameters' RRefs; zd_ps_model_t is both,
    over the servers at ranks 0 .. num_servers - 1. */
static zd_ps_model_t *trainer_net_new(const options_t *o)
{
    zd_optim_config_t sgd = zd_optim_sgd_defaults(o->lr);
    return zd_ps_model_new(NULL, (int)o->num_servers, &sgd, NULL);
}

/*  ---- run_training_loop ---- */

/*  One batch under a distributed autograd context: forward on the server,
    nll loss here, backward through the server, a step there. The loss,
    or NAN with the error set. */
static double train_batch(zd_ps_model_t *model, zd_tensor_t *x, zd_tensor_t *y)
{
    double loss_value = NAN;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        zd_tensor_t *out = NULL, *loss = NULL;
        if (zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) == 0 &&
            zd_nn_nll_loss(out, y, &loss) == 0) {
            /* A diverged model's gradients would reach every trainer. */
            if (!isfinite(zd_tensor_data(loss)[0]))
                zd_error_set("the loss is %g: the model diverged (try a lower --lr)",
                             (double)zd_tensor_data(loss)[0]);
            else if (zd_ps_model_backward(model, ctx, loss) == 0 &&
                     zd_ps_model_step(model, ctx) == 0)
                loss_value = zd_tensor_data(loss)[0];
        }
        zd_tensor_unref(loss);
        zd_tensor_unref(out);
    }
    return loss_value;
}

/*  The tutorial's loop: every batch of every epoch, in this trainer's own
    order. *samples: the samples trained on. */
static int run_training_loop(const options_t *o, zd_ps_model_t *model, const zd_dataset_t *train,
                             int64_t *samples)
{
    int64_t nb = zd_dataset_num_batches(train, o->batch_size), done = 0;
    long long rank = (long long)o->world.rank;
    for (int64_t epoch = 0; epoch < o->epochs; epoch++) {
        int64_t *order = zd_dataset_order(train, (uint64_t)(o->seed + epoch + 1000 * rank));
        if (!order)
            return -1;
        for (int64_t b = 0; b < nb && (o->max_batches <= 0 || done < o->max_batches); b++) {
            zd_tensor_t *x, *y;
            if (zd_dataset_batch(train, order, b * o->batch_size, o->batch_size, &x, &y) < 0) {
                free(order);
                return -1;
            }
            double loss = train_batch(model, x, y);
            *samples += zd_tensor_size(x, 0);
            zd_tensor_unref(x);
            zd_tensor_unref(y);
            if (isnan(loss)) {
                zd_error_wrap("batch %lld (epoch %lld)", (long long)b, (long long)epoch + 1);
                free(order);
                return -1;
            }
            done++;
            if (o->log_interval > 0 && b % o->log_interval == 0)
                printf("Rank %lld training batch %lld loss %.6f (epoch %lld)\n", rank, (long long)b,
                       loss, (long long)epoch + 1);
        }
        free(order);
    }
    printf("Training complete!\n");
    return 0;
}

/*  ---- get_accuracy ---- */

/*  The model's accuracy on the first `limit` test images (0: all), in
    evaluation mode (dropout off) and outside any autograd context. */
static int get_accuracy(zd_ps_model_t *model, const zd_dataset_t *test, int64_t limit, double *acc)
{
    printf("Getting accuracy....\n");
    return train_ps_accuracy(model, test, limit, EVAL_BATCH, acc);
}

/*  ---- run_worker ---- */

static int run_trainer(const options_t *o)
{
    long long rank = (long long)o->world.rank;
    char dir[2048], name[32];
    if (o->data_dir)
        snprintf(dir, sizeof dir, "%s", o->data_dir);
    else if (zd_dataset_find_dir(dir, sizeof dir) < 0)
        return -1;
    zd_dataset_t *train = zd_dataset_load(dir, ZD_DATASET_TRAIN);
    zd_dataset_t *test = train ? zd_dataset_load(dir, ZD_DATASET_TEST) : NULL;
    zd_ps_model_t *model = test ? trainer_net_new(o) : NULL;
    snprintf(name, sizeof name, "trainer_%lld", rank);
    bool joined = model && flags_world_init(&o->world, name, -1, "ps_tutorial") == 0;
    int rc = joined ? 0 : -1;
    int64_t samples = 0;
    double acc = 0, t0 = train_now();
    if (rc == 0)
        rc = run_training_loop(o, model, train, &samples);
    double seconds = train_now() - t0;
    if (rc == 0 && get_accuracy(model, test, o->eval_samples, &acc) == 0)
        printf("Rank %lld test accuracy %.2f %%\nRank %lld throughput %.0f samples/s\n", rank,
               100 * acc, rank, seconds > 0 ? (double)samples / seconds : 0);
    else if (rc == 0)
        rc = -1;
    if (rc < 0)
        fprintf(stderr, "ps_tutorial: trainer %lld: %s\n", rank, zd_error_last());
    /* The model's RRefs go before the world does. */
    zd_ps_model_free(model);
    if (joined && zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0 && rc == 0) {
        fprintf(stderr, "ps_tutorial: trainer %lld: shutdown: %s\n", rank, zd_error_last());
        rc = -1;
    }
    zd_dataset_free(test);
    zd_dataset_free(train);
    return rc;
}

int main(int argc, char **argv)
{
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    options_t o = {.world = flags_world_default(),
                   .batch_size = 32,
                   .epochs = 1,
                   .seed = 1,
                   .lr = 0.03,
                   .max_batch_size = 1024,
                   .num_servers = 1};
    const flag_t flags[] = {
        FLAGS_WORLD(o.world),
        {"data_dir", FLAG_STRING, &o.data_dir,
         "MNIST-format files (default: ./data if it has them, else Debian's Fashion-MNIST)"},
        {"batch_size", FLAG_INT, &o.batch_size, "samples per batch"},
        {"lr", FLAG_DOUBLE, &o.lr, "SGD learning rate"},
        {"epochs", FLAG_INT, &o.epochs, "passes over the training set"},
        {"max_batches", FLAG_INT, &o.max_batches, "stop each trainer after N batches (0: none)"},
        {"seed", FLAG_INT, &o.seed, "seed of the weights, shuffling and dropout"},
        {"log_interval", FLAG_INT, &o.log_interval, "print the loss every N batches (0: never)"},
        {"eval_samples", FLAG_INT, &o.eval_samples, "test images to evaluate (0: all)"},
        {"max_batch_size", FLAG_INT, &o.max_batch_size,
         "server: the largest batch a forward may carry"},
        {"num_servers", FLAG_INT, &o.num_servers,
         "1: the Net on rank 0; 2: its convolutions on rank 0, its linear layers on rank 1"},
    };
    int pr =
        flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                    "PyTorch's parameter-server tutorial on the remote model of <zdist/ps.h>.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (o.batch_size < 1 || o.batch_size > o.max_batch_size || o.epochs < 1 || o.lr <= 0 ||
        o.max_batches < 0 || o.log_interval < 0 || o.eval_samples < 0 ||
        (o.num_servers != 1 && o.num_servers != 2)) {
        fprintf(stderr,
                "ps_tutorial: --batch_size from 1 to --max_batch_size, --epochs and "
                "--lr positive, the counts >= 0, --num_servers 1 or 2\n");
        return 2;
    }
    if (flags_world_resolve(&o.world, 4, "ps_tutorial") < 0)
        return 2;
    if (o.world.world_size <= o.num_servers) {
        fprintf(stderr, "ps_tutorial: a world of %lld with %lld servers has no trainer\n",
                (long long)o.world.world_size, (long long)o.num_servers);
        return 2;
    }
    /* The world's processes share this host's cores: a trainer computes
       only its loss, and a server with several trainers runs their passes
       side by side, one thread each, rather than each pass on every core
       while the others wait (as rpc_ps does). */
    if (o.world.world_size > 2 && zd_nn_set_num_threads(1) < 0)
        return 1;
    bool server = o.world.rank < o.num_servers;
    int rc = server ? run_parameter_server(&o, (int)o.world.rank) : run_trainer(&o);
    if (rc < 0 && server)
        fprintf(stderr, "ps_tutorial: parameter server: %s\n", zd_error_last());
    return rc < 0 ? 1 : 0;
}
