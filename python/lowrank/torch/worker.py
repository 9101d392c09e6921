"""The thread that runs a communicator's calls for the hook, one per communicator.

DDP calls the hook bucket by bucket, in bucket order, on every rank. The worker runs the jobs in
the order they were submitted, so every comm rank issues its lowrank calls in the same order
(which the C API requires), while backward goes on computing the next buckets' gradients. A job's
result or exception completes its torch future from this thread.
"""
import contextlib
import queue
import threading


class Worker:
    """A FIFO of jobs (callables) run by one daemon thread, started at the first submit."""

    def __init__(self, name):
        self._name = name
        self._jobs = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()
        self._stopping = False

    def submit(self, job, future=None, context=None):
        """Queue job(); its return value (or exception) completes `future` when given, inside
        `context()` when given (CUDA: the stream the future must record its event on). A job
        without a future must not raise (drain's is the only one)."""
        with self._lock:
            if self._stopping:
                raise RuntimeError(f"{self._name}: the worker was stopped")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._jobs.put((job, future, context))

    def drain(self):
        """Wait until every job submitted so far has run."""
        done = threading.Event()
        self.submit(done.set)
        done.wait()

    def stop(self, timeout=None):
        """Run what is queued, then end the thread; False if it is still running after
        `timeout` seconds (None: wait as long as it takes)."""
        with self._lock:
            thread = self._thread
            if thread is not None and not self._stopping:
                self._stopping = True
                self._jobs.put((None, None, None))
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            return False
        with self._lock:
            self._thread = None
        return True

    def _run(self):
        while True:
            job, future, context = self._jobs.get()
            if job is None:
                return
            with context() if context is not None else contextlib.nullcontext():
                try:
                    result = job()
                except BaseException as e:  # noqa: B902 - every failure goes to the future
                    future.set_exception(e)
                    continue
                if future is not None:
                    future.set_result(result)
