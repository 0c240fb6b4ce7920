KEEP = []   # ps_exit.py keeps its Trainer here, alive until the interpreter exits
