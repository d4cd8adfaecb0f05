import sys

from coevo.training.cpu_lora.program import main

sys.exit(main())
