"""Eager checkpointing APIs on remat's runtime: DeepSpeed's (`checkpointing`), SageMaker smp's, FairScale's and
modalities' (`wrappers`). All run through one engine (`region`) and work inside torch.compile as marked regions."""
