"""coevo's built-in CPU trainer: supervised fine-tuning of a LoRA adapter on a trajectory export,
starting from the base model's GGUF file (the shipped Gemma 3 270M by default).

Run by the training worker as ``python -m coevo.training.cpu_lora`` (registered with
``manage.py trainer_register_cpu_lora``, coevo.training.builtin). It is a standalone program:
no Django setup, only the trainer's environment and the run's ``COEVO_*`` inputs. Its libraries
(torch, transformers, peft, gguf) are the optional extra ``coevo[train]``.

Modules: ``libraries`` (which libraries it needs and the install hint; imported by the
registration too, so it imports nothing heavy), ``options`` (the command line), ``rows`` (the
export read into token sequences; plain Python), ``model`` and ``loop`` (torch: loading, LoRA,
the training loop, saving), ``program`` (main). docs/training.md, "The built-in CPU trainer".
"""
