/* memreport: the memory of one training step under each strategy, by
 * ledger tag, as a table and an SVG; programs/program_memreport.c has the flags.
 * Its whole logic is the library call fr_memreport_main (programs/programs.h), so
 * a program that registers its own model reports on it the same way. */
#include <frugal/frugal.h>

int main(int argc, char **argv) { return fr_memreport_main(argc, argv); }
