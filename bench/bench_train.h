/* `baton bench train [options] [--json]`: CPU training throughput of a small
 * Llama, baton against PyTorch eager on the same config and thread count
 * (bench/bench_train.py), printed with their ratio. bench/cmd_bench.c
 * dispatches "train" here. Returns a process exit status (0 ok, 1 failure,
 * 2 usage). */
#ifndef BT_BENCH_BENCH_TRAIN_H
#define BT_BENCH_BENCH_TRAIN_H

int bench_train_main(int argc, char **argv);

#endif
