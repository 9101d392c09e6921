"""PowerSGDState's parameters as lowrank sees them (a mixin of hook.py's PowerSGDState): numbered at
first sight (tensor ids), each bucket declared with its ids, shapes and ranks (tensor_ranks.py,
adaptive.py)."""
import collections
import math

from ..comm import tensor_array
from ..errors import InvalidArgumentError, LowrankError
from .signals import combine
from .tensor_ranks import TensorRanks

# A bucket as lowrank last took it: pkey and grad_shapes as DDP gave them, ids and shapes as
# declared (array: the declaration, lowrank.tensor_array), buf held until its release.
# ranks: each parameter's approxRank as declared (PowerSGDState._ranks_of).
Bucket = collections.namedtuple("Bucket", "device ptr buf pkey grad_shapes ids shapes array ranks")


class Numbering:
    """Tensor ids and ranks: set_tensor_ranks, tensor_ranks, adaptive_signals; _declare."""

    def set_tensor_ranks(self, exclude=None, rank_of=None, model=None):
        """Replace the per-parameter settings (exclude, rank_of, model: as the constructor's;
        model None keeps the one given before). From the next step each parameter is declared
        with its new treatment; a parameter whose k changes keeps its state in lowrank: its
        residual as it is, its warm-start Q cut to the first k columns or grown with fresh ones
        drawn alike on every rank (lowrankStats_t.rankChanges counts each change). Call it on
        every rank between the same two steps: ranks that all change a tensor, to different ks,
        make that step's backward raise lowrankInvalidUsage on every rank; a change on some
        ranks only fails the communicators (their calls go out of step): make a new state.
        Not collective.
        Raises ValueError, TypeError as the constructor (nothing changes then).
        Thread safety: between steps, on the training thread."""
        self._check_open("set_tensor_ranks")
        if model is None:
            model = self._ranks.model
        self._ranks = TensorRanks(exclude, rank_of, model)
        self._rank_by_id, self._ident_rank, self._warned_unmatched = None, None, False

    def tensor_ranks(self):
        """Each parameter's approximation rank in force at the last complete step, as lowrank
        planned it (lowrankBufferGetTensorRanks): {name: k}, keyed by the parameter's id
        (state_dict, "the ids") where no model was given or the model has no name for it. k is
        0 for a parameter allreduced exactly then: excluded, 1-D, failing the compression-rate
        test, or in its warm-up. Parameters of buckets not planned yet are left out. Waits for
        the work queued so far. Thread safety: between steps, on the training thread."""
        name_of = self._name_of_id()
        out = {}
        for _, b in sorted(self._buckets.items()):
            self._workers[b.device].drain()
            ks = self._comms[b.device].tensor_ranks(b.ptr)
            if len(ks) == len(b.ids):
                out.update((name_of.get(n, n), k) for n, k in zip(b.ids, ks))
        return out

    def adaptive_signals(self):
        """The adaptive rank's last decision: (measured step, {name: (gradient norm, compression
        error)}), the allreduced numbers it decided from (lowrank.torch.adaptive), keyed as
        tensor_ranks(); (None, {}) before the first decision or without a rule. The same on
        every comm rank. Thread safety: between steps, on the training thread."""
        if self._adaptive is None or self._adaptive.last is None:
            return None, {}
        step, signals = self._adaptive.last
        name_of = self._name_of_id()
        return step, {name_of.get(n, n): v for n, v in signals.items()}

    def _name_of_id(self):
        """{id: name} of the parameters numbered so far (the id itself where the model, if
        any, has no name for it)."""
        names = self._ranks.names()
        return {n: names.get(ident, n) for ident, n in self._param_pos.items()}

    def _param_key(self, bucket):
        """The ids of the bucket's parameters: each numbered at its first sight in this process
        (its identity: device, address, shape). Objects without parameters() (and those whose
        parameters do not match the gradients one to one) are keyed by gradients. A number a
        loaded state holds with another shape raises LowrankError (the numbering differs)."""
        grads = bucket.gradients()
        params = bucket.parameters() if hasattr(bucket, "parameters") else grads
        if len(params) != len(grads):
            params = grads
        key = []
        for p in params:
            ident = (p.device.type, p.device.index, p.data_ptr(), tuple(p.shape))
            n = self._param_pos.get(ident)
            if n is None:
                n = len(self._param_pos)
                want = self._expect.get(n)
                if want is not None and want != declared_shape(ident[3]):
                    raise LowrankError(5, numbering_message([(n, ident[3], want)]),
                                       "powerSGD_hook")
                self._param_pos[ident] = n
            key.append(n)
        return tuple(key)

    def _declare(self, bucket, device, buf):
        """The bucket as lowrank takes it (Bucket: its buffer, ids and shapes, the declaration's
        array, made again only when one of them changes), recorded for this step."""
        index = bucket.index()
        pkey = self._param_key(bucket)  # numbers the parameters from DDP's first step on
        shapes = tuple(tuple(g.shape) for g in bucket.gradients())
        if self._adaptive is not None and not self._step:  # the step's first bucket
            self._adapt()
        ranks, ruled = self._ranks_of(pkey, shapes)
        total = sum(math.prod(s) for s in shapes)
        if total != buf.numel():
            raise InvalidArgumentError(4, f"bucket {index}: its gradients have {total} elements, "
                                          f"its buffer {buf.numel()}", "powerSGD_hook")
        ptr = buf.data_ptr()
        now = self._step.get(index)
        if now is not None and (now.device, now.ptr) != (device, ptr):
            raise LowrankError(5, f"bucket {index} came twice in one step with other buffers: one "
                                  "PowerSGDState serves one DDP model (make one per model)",
                               "powerSGD_hook")
        b = self._buckets.get(index)
        if b is None or (b.device, b.ptr, b.pkey, b.grad_shapes, b.ranks) != \
                (device, ptr, pkey, shapes, ranks):
            # zero-element tensors take no room in the buffer: not declared
            kept = [(n, declared_shape(s), k) for n, s, k in zip(pkey, shapes, ranks)
                    if math.prod(s)]
            b = Bucket(device, ptr, buf, pkey, shapes, tuple(n for n, _, _ in kept),
                       tuple(s for _, s, _ in kept), tensor_array(kept), ranks)
        self._step[index] = b
        self._unclaimed.difference_update(b.ids)
        if self._adaptive is not None:  # every step adds to the window's sums; the last measures
            self._measure[(device, ptr)] = (self.iter, b.ids, b.shapes, ruled,
                                            self._adaptive.measures(self.iter))
        return b

    def _set_ranks(self, pkey):
        """Each id's approxRank as exclude and rank_of set it (-1: the default), resolved
        against the parameters as they are at the first step after the settings (a model moved
        to its device after the state was made still matches)."""
        if self._ranks.empty:
            return (-1,) * len(pkey)
        if self._ident_rank is None:
            self._ident_rank = self._ranks.resolve()
        if self._rank_by_id is None or len(self._rank_by_id) != len(self._param_pos):
            self._rank_by_id = {n: self._ident_rank.get(ident, -1)
                                for ident, n in self._param_pos.items()}
        return tuple(self._rank_by_id[n] for n in pkey)

    def _ranks_of(self, pkey, shapes):
        """(each id's approxRank (lowrank's: -1 default, 0 exact, or its own k) for the ids of
        pkey (gradient shapes `shapes`), the ids an adaptive rank rules (empty without
        one)): _set_ranks, with the rule's k for the ids it rules."""
        ranks = self._set_ranks(pkey)
        if self._adaptive is None:
            return ranks, frozenset()
        # it rules the parameters exclude and rank_of leave to the default (k -1) of 2 or more
        # dimensions (1-D parameters are always exact)
        ruled = frozenset(n for n, k, s in zip(pkey, ranks, shapes) if k == -1 and len(s) >= 2)
        first = self._adaptive.initial()
        return tuple(self._adaptive_k.get(n, first) if n in ruled else k
                     for n, k in zip(pkey, ranks)), ruled

    def _adapt(self):
        """At the first bucket of a step that decides (AdaptiveRank.decides): the numbers the
        jobs measured at the decided step (waited for), summed over the process group's ranks
        (one small all_reduce, the same on every rank at this step), turned into each
        parameter's gradient norm and compression error, and the rule's ks taken for this
        step's declarations."""
        m = self._adaptive.decides(self.iter)
        if m is None:
            return
        for worker in self._workers.values():
            worker.drain()  # the measuring jobs of step m have run (on the host, long since)
        local = self._signals.pop(m, {})
        for old in [s for s in self._signals if s < m]:
            del self._signals[old]
        self._adaptive_k.update(self._adaptive.decide(combine(local, self.process_group), step=m))


def numbering_message(clashes):
    """clashes: (id, this parameter's shape, the saved shape)."""
    what = "; ".join(f"id {n}: this model's parameter {tuple(s)}, saved {tuple(w)}"
                     for n, s, w in clashes[:5])
    return (f"the parameters are numbered otherwise than in the run that saved ({what}): DDP's "
            "first step handed them in another order (find_unused_parameters with another "
            "bucket_cap_mb, or another model); resume with the DDP arguments that saved, or "
            "without the hook's state")


def declared_shape(shape):
    """A gradient's shape as declared to lowrank: a 0-dim tensor as (1,), more than 8 dimensions
    as (shape[0], the rest) (the same matrix view)."""
    shape = tuple(shape)
    if not shape:
        return (1,)
    return shape if len(shape) <= 8 else (shape[0], math.prod(shape[1:]))

