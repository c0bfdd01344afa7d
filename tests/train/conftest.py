import torch

# Tiny tensors: one thread avoids pool start-up and contention, which dominate at this size.
torch.set_num_threads(1)
