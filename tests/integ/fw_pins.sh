# The frameworks' sets from PyPI, pinned (sourced, not run: fw_common.sh, and the Slurm
# scripts that run a framework). Each is installed in $deps/NAME by fw_install.
# shellcheck shell=bash
# shellcheck disable=SC2034 # read by the scripts that source this file
# pytorch-lightning 1.9.5 is the last 1.x
# (torch >= 1.10); transformers 4.29.2 with the tokenizers it takes (a binary wheel, abi3)
# and accelerate, which its Trainer needs. The rest is what their imports reach that Debian
# lacks.
FW_LIGHTNING=(pytorch-lightning==1.9.5 lightning-utilities==0.8.0 torchmetrics==0.11.4
    fsspec==2023.1.0 tqdm==4.65.0 packaging==23.1)
FW_HF=(transformers==4.29.2 tokenizers==0.13.3 huggingface-hub==0.14.1 accelerate==0.20.3
    filelock==3.12.0 regex==2023.5.5 fsspec==2023.1.0 tqdm==4.65.0 packaging==23.1)
