/*
 * A Delta Lake log store for local tables (file:) that is safe with several writers (drivers,
 * JVMs) at once.
 *
 * Delta commits version N of a table by creating <table>/_delta_log/<N>.json and needs that
 * create to fail when the file already exists: two writers that both think N is next must not
 * both succeed. Delta's default store for file: paths (HDFSLogStore) checks that N.json does
 * not exist and then renames a temporary file onto it; a local filesystem's rename replaces an
 * existing target, and the check and the rename are guarded by a lock of one JVM only, so two
 * JVMs that both pass the check both "commit" and one commit is lost. This one writes the
 * commit to a temporary file beside N.json, fsyncs it, and then creates N.json as a hard link
 * to it (link(2)): the kernel creates the name only if it does not exist, in one step, and the
 * file appears whole. The loser gets the java.nio.file.FileAlreadyExistsException Delta turns
 * into a retry of the commit at N+1 (or a typed conflict). Writes that replace a file
 * (_last_checkpoint) are an fsync'd temporary file renamed over the old one.
 *
 * Use: spark.delta.logStore.file.impl = dcpcdc.delta.LocalHardLinkLogStore (every dcp-cdc
 * session sets it). Built by `make setup` (build-support/jars/build_jar.py).
 */
package dcpcdc.delta;

import java.io.BufferedOutputStream;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.channels.Channels;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.UUID;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

public class LocalHardLinkLogStore extends HadoopFileSystemLogStore {

    public LocalHardLinkLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(
            Path path,
            Iterator<String> actions,
            Boolean overwrite,
            Configuration hadoopConf) throws IOException {
        java.nio.file.Path target = localFile(path, hadoopConf).toPath();
        java.nio.file.Path folder = target.getParent();
        if (!Files.isDirectory(folder)) {
            throw new FileNotFoundException("No such directory: " + folder);
        }
        // A dot name, as Delta's own stores use: never read as a commit or a checkpoint.
        java.nio.file.Path temp = folder.resolve(
            String.format(".%s.%s.tmp", target.getFileName(), UUID.randomUUID()));
        try {
            try (FileChannel channel = FileChannel.open(
                    temp, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
                OutputStream out = new BufferedOutputStream(Channels.newOutputStream(channel));
                while (actions.hasNext()) {
                    out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
                }
                out.flush();
                channel.force(true);
            }
            if (overwrite) {
                // A Hadoop checksum left beside the old file would not match the new one.
                Files.deleteIfExists(folder.resolve("." + target.getFileName() + ".crc"));
                Files.move(temp, target, StandardCopyOption.ATOMIC_MOVE);  // rename(2)
            } else {
                link(target, temp, path);
            }
            syncFolder(folder);
        } finally {
            Files.deleteIfExists(temp);
        }
    }

    /** Local files can be seen while they are written: Delta then writes its checkpoints (which
     * do not go through the log store) to a temporary file and renames it. */
    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return true;
    }

    /** Creates {@code target} as a second name of {@code temp}, only if it does not exist. */
    private static void link(java.nio.file.Path target, java.nio.file.Path temp, Path path)
            throws IOException {
        try {
            Files.createLink(target, temp);
        } catch (FileAlreadyExistsException e) {
            FileAlreadyExistsException named = new FileAlreadyExistsException(path.toString());
            named.initCause(e);
            throw named;
        } catch (UnsupportedOperationException e) {
            throw new IOException(
                "LocalHardLinkLogStore: the filesystem of " + target.getParent()
                    + " has no hard links, which a commit needs to be created atomically", e);
        }
    }

    /** The new name survives a crash once its folder is synced. */
    private static void syncFolder(java.nio.file.Path folder) throws IOException {
        try (FileChannel channel = FileChannel.open(folder, StandardOpenOption.READ)) {
            channel.force(true);
        }
    }

    private static File localFile(Path path, Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        if (fs instanceof LocalFileSystem local) {
            return local.pathToFile(path);
        }
        if (fs instanceof RawLocalFileSystem raw) {
            return raw.pathToFile(path);
        }
        throw new IOException(
            "LocalHardLinkLogStore writes local files (file:) only, not " + path + " ("
                + fs.getClass().getName() + "): set spark.delta.logStore." + path.toUri().getScheme()
                + ".impl to a log store for that filesystem");
    }
}
