"""The training engine, shared by every recipe (roctune.recipes): batch planning and collation (batching),
losses over supervised positions (losses), optimizer and schedule (optim), the one loop (loop), checkpoints
(checkpoint), out-of-memory handling (oom), progress lines (progress), several processes (distributed, launch)
and the steps every run shares before and after the loop (session). Nothing here knows about SFT or DPO."""
