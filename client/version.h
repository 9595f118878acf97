/* gpurun's version: what --version prints and the batch script's header names; `make
 * install` writes it into gr.pc (the Makefile reads it from this line). */
#ifndef GPURUN_CLIENT_VERSION_H
#define GPURUN_CLIENT_VERSION_H

#define GPURUN_VERSION "0.1.0"

#endif
