"""No CoT: supervised fine-tuning on the final answer only, asked for by the no-hint prompt
(output line `pi:`); the model answers with the final array and nothing else."""

from stabray.methods.base import METHODS, Method


@METHODS.register("no_cot")
class NoCoT(Method):
    chain_at_eval = False  # eval prompt = question_nohint, gold target = the final alone
    steps_at_eval = False  # no chain: the EAF and eq. (4) are not measured (empty sums)

    def train_view(self, ex, epoch, rng):
        return ex.question_nohint, None
