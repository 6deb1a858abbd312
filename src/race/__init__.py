"""RACE: compute-accounted RL post-training of language models.

The accounting core (``race.accounting``) is standard-library only; heavy libraries
(torch, transformers, peft, trl, ray, matplotlib) are imported inside the functions that
need them.
"""

__version__ = "0.1.0"
