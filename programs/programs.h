/* programs.h: the train, validate and memreport programs as library calls.
 * Each takes the program's command line (argv[0] first) and returns its
 * exit status: 0 on success, non-zero with the library's message on
 * stderr; it prints what the program prints. `--model NAME` reaches every
 * model in the registry (models/registry.h), so a user who writes a model in C
 * runs the library's own training loop, validation pass and memory report
 * on it by registering it first:
 *
 *     int main(int argc, char **argv) {
 *         fr_model_register("tiny", false, tiny_create, "tiny (a 3-layer CNN)");
 *         return fr_train_main(argc, argv);   // my_train --model tiny --data ...
 *     }
 *
 * build/examples/{train,validate,memreport} are exactly such mains. Under
 * mpirun a failing rank ends the whole job (MPI_Abort), as the programs do;
 * otherwise nothing here exits the process. */
#ifndef FR_PROGRAMS_H
#define FR_PROGRAMS_H

#ifdef __cplusplus
extern "C" {
#endif

int fr_train_main(int argc, char **argv);
/* fr_train_main with `model` trained when --model is not given (fr_train_main's
 * is resnet20): an example that registers its own model trains that model by
 * default, never a different one silently. A --resume run keeps its file's. */
int fr_train_main_model(int argc, char **argv, const char *model);
int fr_validate_main(int argc, char **argv);
int fr_memreport_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
